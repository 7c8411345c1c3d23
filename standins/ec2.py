"""Running the boot script Lockstep generated, as an EC2 instance would: moto stores user data, runs none.

- :class:`FakeImds`: IMDSv2 on 127.0.0.1 (aiohttp, in the test's loop). Each instance has its own base URL
  (``<url>/<instance id>``, given to the wrapper as ``LOCKSTEP_IMDS_URL``): a session token first (PUT
  ``/latest/api/token`` with a TTL header), then ``instance-id`` / ``local-ipv4`` with that token.
- :class:`Node`: one instance's boot. Its user data is read back from moto (DescribeInstanceAttribute) and
  run with bash, with two programs of the machine replaced on ``PATH``: ``docker`` (the container runtime's
  part: runs the command's ``sh -c`` in the ``-w`` folder with only the ``-e`` variables) and ``shutdown``
  (an instance-initiated shutdown with terminate behaviour: terminates the instance at moto; or, with
  ``shutdown_terminates=False``, only notes the call). Both note their argv in ``calls``. A boot started with
  ``own_session=True`` can be powered off (``power_off``: every process of it at once), as when EC2 takes the
  machine.
- :func:`moto_subnets`: a VPC of its own at moto (10.213.0.0/16, one subnet per zone), so the instances'
  private addresses are ones this host does not use (tests/aws/loopback.py adds such addresses to ``lo`` for a
  test, so a node can listen on its "private IP").

For tests/ and bench/ (bench/leaks.py soaks moto with it), never the product (standins/__init__.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
from aiohttp import web
from aiohttp.test_utils import TestServer

VPC_CIDR = "10.213.0.0/16"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"


def ec2_client(endpoint: str) -> Any:
    return boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)


def s3_client(endpoint: str) -> Any:
    return boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)


def moto_subnets(endpoint: str) -> dict[str, str]:
    """A fresh VPC with one subnet per zone of us-east-1: {zone: subnet id}."""
    ec2 = ec2_client(endpoint)
    vpc = ec2.create_vpc(CidrBlock=VPC_CIDR)["Vpc"]["VpcId"]
    zones = sorted(z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"])
    out = {}
    for n, zone in enumerate(zones, start=1):
        out[zone] = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.213.{n}.0/24", AvailabilityZone=zone)["Subnet"][
            "SubnetId"]
    return out


class FakeImds:
    """IMDSv2 for several instances: ``base(instance_id)`` is one instance's metadata endpoint."""

    def __init__(self) -> None:
        self.nodes: dict[str, str] = {}  # instance id → private address
        self.tokens: set[str] = set()
        self.url = ""
        self.refused = 0  # metadata requests without a valid token
        # The market's notices, per instance (issue 30): what spot/instance-action and
        # events/recommendations/rebalance answer once set (404 until then, as on EC2).
        self.interruptions: dict[str, dict[str, str]] = {}
        self.rebalances: dict[str, dict[str, str]] = {}
        self.asked: dict[str, int] = {}  # metadata path → how many times it was read
        app = web.Application()
        app.router.add_put("/{node}/latest/api/token", self._token)
        app.router.add_get("/{node}/latest/meta-data/{path:.+}", self._meta)
        self._server = TestServer(app, host="127.0.0.1")

    def base(self, instance_id: str) -> str:
        return f"{self.url}/{instance_id}"

    def interrupt(self, instance_id: str, action: str = "terminate", at: str = "2026-12-06T12:02:00Z") -> None:
        """Issue a spot interruption notice, as EC2 does two minutes before it acts."""
        self.interruptions[instance_id] = {"action": action, "time": at}

    def recommend_rebalance(self, instance_id: str, at: str = "2026-12-06T12:00:00Z") -> None:
        self.rebalances[instance_id] = {"noticeTime": at}

    async def __aenter__(self) -> FakeImds:
        await self._server.start_server()
        self.url = str(self._server.make_url("")).rstrip("/")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.close()

    async def _token(self, request: web.Request) -> web.Response:
        if not request.headers.get(TOKEN_TTL_HEADER, "").isdigit():
            return web.Response(status=400)
        token = uuid.uuid4().hex
        self.tokens.add(token)
        return web.Response(text=token)

    async def _meta(self, request: web.Request) -> web.Response:
        if request.headers.get(TOKEN_HEADER) not in self.tokens:
            self.refused += 1
            return web.Response(status=401)
        node, path = request.match_info["node"], request.match_info["path"]
        self.asked[path] = self.asked.get(path, 0) + 1
        notice = {"spot/instance-action": self.interruptions,
                  "events/recommendations/rebalance": self.rebalances}.get(path, {}).get(node)
        if notice is not None:
            return web.json_response(notice)
        if node not in self.nodes:
            return web.Response(status=404)
        value = {"instance-id": node, "local-ipv4": self.nodes[node]}.get(path)
        return web.Response(text=value) if value is not None else web.Response(status=404)


DOCKER_SHIM = '''#!{python}
"""docker, as the wrapper uses it: `run [opts] IMAGE CMD...` runs CMD here with only the -e variables."""
import json, os, sys
args = sys.argv[1:]
with open({calls!r}, "a") as fh:
    fh.write(json.dumps(["docker", *args]) + "\\n")
if args[:1] == ["login"]:
    sys.stdin.read()
    sys.exit(0)
assert args[0] == "run", args
args = args[1:]
valued = {{"-v", "-w", "-e", "--network", "--ipc", "--gpus", "--device", "--ulimit", "--cap-add"}}
env = {{"PATH": os.environ["PATH"], "HOME": "/root"}}
cwd = "/"
while args[0].startswith("-"):
    flag = args.pop(0)
    if flag in valued:
        value = args.pop(0)
        if flag == "-e":
            name, eq, given = value.partition("=")
            if eq:
                env[name] = given
            elif name in os.environ:
                env[name] = os.environ[name]
        elif flag == "-w":
            cwd = value
image = args.pop(0)
os.chdir(cwd)
os.execvpe(args[0], args, env)
'''

SHUTDOWN_SHIM = '''#!{python}
"""shutdown, on an instance launched with InstanceInitiatedShutdownBehavior=terminate."""
import json, sys
with open({calls!r}, "a") as fh:
    fh.write(json.dumps(["shutdown", *sys.argv[1:]]) + "\\n")
if {terminates!r}:
    import boto3
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url={endpoint!r}, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    [res] = ec2.describe_instances(InstanceIds=[{instance!r}])["Reservations"]
    if res["Instances"][0]["State"]["Name"] not in ("shutting-down", "terminated"):  # else EC2 took it already:
        ec2.terminate_instances(InstanceIds=[{instance!r}])  # (moto would write a second termination time)
'''


POWEROFF_SHIM = '''#!{python}
"""poweroff -f, the boot script's and the wrapper's fallback: noted, never the host's own."""
import json, sys
with open({calls!r}, "a") as fh:
    fh.write(json.dumps(["poweroff", *sys.argv[1:]]) + "\\n")
'''


def user_data_of(endpoint: str, instance_id: str) -> str:
    """The user data moto keeps for an instance, decoded."""
    value = ec2_client(endpoint).describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(value["UserData"]["Value"]).decode("utf-8")


class Node:
    """One instance's boot: its user data run with bash, as cloud-init would, on this host."""

    def __init__(self, endpoint: str, instance_id: str, root: Path, imds: FakeImds, *,
                 shutdown_terminates: bool = True) -> None:
        self.endpoint = endpoint
        self.instance_id = instance_id
        self.dir = root / instance_id
        self.bin = self.dir / "bin"
        self.work = self.dir / "var-lib-lockstep"
        self.bin.mkdir(parents=True)
        self.work.mkdir()
        self.calls_file = self.dir / "calls.jsonl"
        self.imds_url = imds.base(instance_id)
        self.user_data = user_data_of(endpoint, instance_id)
        self.script = self.dir / "user-data.sh"
        self.script.write_text(self.user_data)
        self.output = self.dir / "console.log"
        for name, text in (("docker", DOCKER_SHIM.format(python=sys.executable, calls=str(self.calls_file))),
                           ("shutdown", SHUTDOWN_SHIM.format(python=sys.executable, calls=str(self.calls_file),
                                                             terminates=shutdown_terminates, endpoint=endpoint,
                                                             instance=instance_id)),
                           ("poweroff", POWEROFF_SHIM.format(python=sys.executable, calls=str(self.calls_file)))):
            path = self.bin / name
            path.write_text(text)
            path.chmod(0o755)
        self.proc: asyncio.subprocess.Process | None = None
        self.own_session = False
        self.exit_code: int | None = None

    def env(self) -> dict[str, str]:
        """A machine's environment: no AWS credentials, the shims first on PATH, IMDS on loopback."""
        path = os.pathsep.join([str(self.bin), os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin",
                                "/usr/sbin", "/sbin"])
        return {"PATH": path, "HOME": "/root", "LANG": "C.UTF-8", "LOCKSTEP_DIR": str(self.work),
                "LOCKSTEP_IMDS_URL": self.imds_url, "LOCKSTEP_SYSRQ": "0"}

    async def start(self, *, own_session: bool = False) -> None:
        """Start the boot; ``own_session``: in a session (process group) of its own, so that
        :meth:`power_off` can take every process of the machine at once."""
        env = self.env()
        for program in ("docker", "shutdown", "poweroff"):  # never the host's own
            assert shutil.which(program, path=env["PATH"]) == str(self.bin / program)
        with self.output.open("wb") as out:  # a local file, opened once: the console's log
            self.proc = await asyncio.create_subprocess_exec("bash", str(self.script), env=env, cwd=self.dir,
                                                             stdout=out, stderr=subprocess.STDOUT,
                                                             start_new_session=own_session)
        self.own_session = own_session

    async def wait(self, limit_s: float = 120) -> int:
        assert self.proc is not None
        try:
            return await asyncio.wait_for(self.proc.wait(), limit_s)
        except TimeoutError:
            self.proc.kill()
            raise AssertionError(f"the boot of {self.instance_id} did not end:\n{self.console()}") from None

    async def run(self, limit_s: float = 120) -> int:
        await self.start()
        self.exit_code = await self.wait(limit_s)
        return self.exit_code

    def terminate_wrapper(self) -> None:
        """SIGTERM to the boot script, which passes it on to the wrapper, as systemd sends when the machine goes
        down."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGTERM)

    def power_off(self) -> None:
        """The machine is gone (EC2 terminated it): SIGKILL to every process of a boot started with
        ``own_session=True`` (to the boot script alone otherwise); nothing when it has ended."""
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            if self.own_session:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
        except ProcessLookupError:
            pass

    def console(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def calls(self, program: str) -> list[list[str]]:
        if not self.calls_file.exists():
            return []
        rows = [json.loads(line) for line in self.calls_file.read_text().splitlines()]
        return [r[1:] for r in rows if r[0] == program]

    def files(self, name: str) -> list[Path]:
        return sorted(self.work.rglob(name))


BUCKET = "lockstep-runs"


def runtime_overrides(endpoint: str) -> dict[str, Any]:
    """AwsConfig settings for the run-time contract at moto: a new bucket, and the VPC of :func:`moto_subnets`."""
    s3_client(endpoint).create_bucket(Bucket=BUCKET)
    return {"runtime_bucket": BUCKET, "s3_endpoint_url": endpoint, "subnet_ids": moto_subnets(endpoint)}
