#!/usr/bin/env python3
"""lockstep-run: the in-job wrapper, the same on every market.

Shipped inside a job's launch payload and run on each node of the job (on the
host on AWS, inside the container on Vast, under ``srun`` on Slurm). Python 3.8+
standard library only, one file, no broker credentials: everything it needs is
in its *manifest* (a JSON document made by the broker at launch).

What it does, in order:

1. works out where it stands in the job (rendezvous): its node rank, the node
   count, every node's address, the head node's address; exported as
   ``LOCKSTEP_*`` variables (docs/runtime.md lists them) so ``torchrun`` can
   start one job across the nodes;
2. unpacks the job's files into its working directory and fetches its data URL;
3. runs the command (in a container when the manifest says so) with the job's
   environment and secrets, each output line time-stamped, secret values
   masked, written to a log file (and to its own stdout);
4. ships the log to where the broker reads it (a presigned object-storage URL
   or a shared directory) while the command runs;
5. enforces ``max_duration`` (TERM, then KILL after a grace period) and passes
   a TERM it receives on to the command (preemption, cancel);
6. records the exit status (``status.json``, and a last ``LOCKSTEP-EXIT`` line
   on stdout for markets whose logs API is the only way out);
7. ends the machine's billing when asked to (``shutdown`` in the manifest:
   instance-initiated shutdown with terminate behaviour on AWS);
8. exits with the command's exit code.

Usage: ``python3 wrapper.py MANIFEST.json`` (``-`` reads stdin), or with the
manifest base64-encoded (gzip allowed) in ``LOCKSTEP_MANIFEST``, or fetched from
the URL in ``LOCKSTEP_MANIFEST_URL``.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error

EXIT_MARKER = "LOCKSTEP-EXIT "
MASK = "*****"
MIN_SECRET_LEN = 4  # shorter values would mask ordinary words
DEFAULT_RDZV_PORT = 29500
WRAPPER_FAILED = 127  # the exit code when the wrapper itself could not start the command


class WrapperError(Exception):
    """The wrapper cannot start the command; reported as the job's failure, with this message."""


def log_time() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# --------------------------------------------------------------------------- transport


def http(method: str, url: str, data: bytes | None = None, headers: dict | None = None, timeout: float = 30.0,
         attempts: int = 5) -> bytes:
    """One HTTP request with bounded, growing retries on network errors and 5xx/429. Raises on the rest."""
    import urllib.request  # here: the broker imports this module's constants, and `lockstep quote` sends nothing

    delay = 1.0
    for attempt in range(attempts):
        req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            if (exc.code < 500 and exc.code != 429) or attempt == attempts - 1:
                raise
        except (urllib.error.URLError, OSError):
            if attempt == attempts - 1:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 30.0)
    raise RuntimeError("unreachable")


def put(url: str, body: bytes, content_type: str = "application/octet-stream") -> None:
    http("PUT", url, body, {"Content-Type": content_type})


def decode_blob(text: str) -> bytes:
    raw = base64.b64decode(text)
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def load_manifest(argv: list[str], environ: dict) -> dict:
    if len(argv) > 1:
        if argv[1] == "-":
            return json.load(sys.stdin)
        with open(argv[1], encoding="utf-8") as fh:
            return json.load(fh)
    if environ.get("LOCKSTEP_MANIFEST"):
        return json.loads(decode_blob(environ["LOCKSTEP_MANIFEST"]))
    if environ.get("LOCKSTEP_MANIFEST_URL"):
        return json.loads(http("GET", environ["LOCKSTEP_MANIFEST_URL"]))
    raise SystemExit("lockstep-run: no manifest (give a file, LOCKSTEP_MANIFEST or LOCKSTEP_MANIFEST_URL)")


# --------------------------------------------------------------------------- rendezvous


def imds(base: str, path: str) -> str:
    """One EC2 instance metadata value (IMDSv2: a session token first)."""
    token = http("PUT", base + "/latest/api/token", b"", {"X-aws-ec2-metadata-token-ttl-seconds": "300"},
                 timeout=5).decode()
    return http("GET", base + "/latest/meta-data/" + path, None, {"X-aws-ec2-metadata-token": token},
                timeout=5).decode().strip()


def own_identity(rdzv: dict, environ: dict) -> str:
    """This node's id as the peer list names it."""
    if environ.get("LOCKSTEP_NODE_ID"):
        return environ["LOCKSTEP_NODE_ID"]
    if rdzv.get("identity") == "imds":
        return imds(environ.get("LOCKSTEP_IMDS_URL", "http://169.254.169.254"), "instance-id")
    return socket.gethostname()


def wait_for_peers(rdzv: dict, deadline: float) -> list[dict]:
    """The peer list the broker publishes once it knows every node's address."""
    while True:
        try:
            if rdzv.get("peers_url"):
                doc = json.loads(http("GET", rdzv["peers_url"], attempts=1, timeout=10))
            else:
                with open(rdzv["peers_file"], encoding="utf-8") as fh:
                    doc = json.load(fh)
            return list(doc["nodes"])
        except (OSError, ValueError, KeyError, urllib.error.URLError):
            if time.time() > deadline:
                raise WrapperError("lockstep-run: the peer list did not arrive in time") from None
            time.sleep(2.0)


def rendezvous(manifest: dict, environ: dict) -> dict:
    """The ``LOCKSTEP_*`` rendezvous variables for this node."""
    rdzv = manifest.get("rendezvous") or {}
    mode = rdzv.get("mode", "single")
    port = int(rdzv.get("port") or DEFAULT_RDZV_PORT)
    gpus = int(rdzv.get("gpus_per_node") or 0)
    if mode == "peers":
        peers = wait_for_peers(rdzv, time.time() + float(rdzv.get("wait_s", 900)))
        me = own_identity(rdzv, environ)
        ids = [str(p.get("id", "")) for p in peers]
        if me not in ids:
            raise WrapperError(f"lockstep-run: this node ({me}) is not in the job's peer list")
        rank = ids.index(me)
        addrs = [str(p["addr"]) for p in peers]
    elif mode == "env":
        # Slurm: the batch step exports the node addresses; each srun task knows its node's index.
        addrs = [a for a in environ.get("LOCKSTEP_NODE_ADDRS", "").split(",") if a]
        rank = int(environ.get("LOCKSTEP_NODE_RANK") or environ.get("SLURM_NODEID") or 0)
        if not addrs:
            addrs = ["127.0.0.1"]
    else:
        addrs = [str(rdzv.get("addr") or "127.0.0.1")]
        rank = 0
    out = {
        "LOCKSTEP_NODE_RANK": str(rank),
        "LOCKSTEP_NUM_NODES": str(len(addrs)),
        "LOCKSTEP_GPUS_PER_NODE": str(gpus),
        "LOCKSTEP_HEAD_ADDR": addrs[0],
        "LOCKSTEP_NODE_ADDRS": ",".join(addrs),
        "LOCKSTEP_RDZV_PORT": str(port),
        # What torch.distributed's env:// initialisation reads, for workloads that use it directly.
        "MASTER_ADDR": addrs[0],
        "MASTER_PORT": str(port),
    }
    return out


# --------------------------------------------------------------------------- files and data


def _inside(base: str, name: str) -> bool:
    target = os.path.realpath(os.path.join(base, name))
    return target == base or target.startswith(base + os.sep)


def unpack_files(blob: str, workdir: str) -> int:
    """Extract the job's files (a base64 tar.gz) into ``workdir``; refuses paths that leave it."""
    base = os.path.realpath(workdir)
    count = 0
    with tarfile.open(fileobj=io.BytesIO(decode_blob(blob)), mode="r:*") as tar:
        for member in tar.getmembers():
            if not (member.isfile() or member.isdir()) or not _inside(base, member.name):
                raise WrapperError(f"lockstep-run: refusing file {member.name!r} from the job's files")
            if hasattr(tarfile, "data_filter"):  # 3.12+, and 3.8-3.11 security releases
                tar.extract(member, base, filter="data")
            else:
                tar.extract(member, base)
            count += member.isfile()
    return count


def fetch_data(data: dict, workdir: str) -> dict:
    """Download the job's data URL (http/https) into the work dir; the variables that point at it."""
    env = {}
    url = data.get("url") or ""
    if url.startswith(("http://", "https://")):
        dest_dir = os.path.join(workdir, "data")
        os.makedirs(dest_dir, exist_ok=True)
        name = data.get("name") or os.path.basename(url.split("?", 1)[0]) or "input"
        dest = os.path.join(dest_dir, name)
        with open(dest, "wb") as fh:
            fh.write(http("GET", url, timeout=300))
        env["LOCKSTEP_DATA_PATH"] = dest
        env["LOCKSTEP_DATA_DIR"] = dest_dir
    for key in ("uri", "path"):
        if data.get(key):
            env["LOCKSTEP_DATA_" + key.upper()] = str(data[key])
    return env


# --------------------------------------------------------------------------- the log


class Log:
    """Time-stamped, masked lines to a file (and stdout), shipped to the broker's sink while the job runs."""

    def __init__(self, manifest: dict, secrets: list[str], rank: int) -> None:
        logs = manifest.get("logs") or {}
        # One manifest serves every node: "{rank}" in the file name becomes this node's rank.
        self.path = (logs.get("file") or os.path.join(manifest["workdir"], "lockstep-{rank}.log")).replace(
            "{rank}", str(rank))
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self.put_url = (logs.get("put_urls") or {}).get(str(rank)) or ""
        self.echo = bool(logs.get("stdout", True))
        self.interval = float(logs.get("interval_s", 5.0))
        self.max_upload = int(logs.get("max_upload_bytes", 64 << 20))
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_LEN}, key=len, reverse=True)
        self.lock = threading.Lock()
        self.fh = open(self.path, "a", encoding="utf-8")  # closed in close()
        self.tail: list[str] = []  # the last lines, for the status
        self.dirty = False
        self.stop = threading.Event()
        self.uploader = threading.Thread(target=self._ship_loop, daemon=True)

    def mask(self, text: str) -> str:
        for s in self.secrets:
            text = text.replace(s, MASK)
        return text

    def line(self, stream: str, text: str) -> None:
        text = self.mask(text.rstrip("\r\n"))
        record = f"{log_time()} {stream} {text}\n"
        with self.lock:
            self.fh.write(record)
            self.fh.flush()
            self.dirty = True
            self.tail.append(text)
            del self.tail[:-20]
            if self.echo:
                sys.stdout.write(record)
                sys.stdout.flush()

    def pump(self, pipe, stream: str) -> threading.Thread:
        def run() -> None:
            for raw in iter(pipe.readline, b""):
                self.line(stream, raw.decode("utf-8", "replace"))
            pipe.close()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def ship(self) -> None:
        """Upload the log (its last ``max_upload_bytes`` when larger) to the presigned URL."""
        if not self.put_url:
            return
        with self.lock:
            self.dirty = False
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as fh:
            if size > self.max_upload:
                fh.seek(size - self.max_upload)
                fh.readline()  # start on a whole line
            body = fh.read()
        try:
            put(self.put_url, body, "text/plain; charset=utf-8")
        except Exception as exc:  # the next round tries again; the job goes on
            with self.lock:
                self.dirty = True
            sys.stderr.write(f"lockstep-run: log upload failed: {type(exc).__name__}\n")

    def _ship_loop(self) -> None:
        while not self.stop.wait(self.interval):
            if self.dirty:
                self.ship()

    def start(self) -> None:
        if self.put_url:
            self.uploader.start()

    def close(self) -> None:
        self.stop.set()
        if self.uploader.is_alive():
            self.uploader.join(timeout=self.interval + 30)
        self.ship()
        self.fh.close()


# --------------------------------------------------------------------------- the command


def command_argv(manifest: dict, env_names: list[str]) -> list[str]:
    """The command to exec: the job's command under ``sh -c``, in a container when asked.

    Variables go into the container by name only (``-e NAME``), so their values
    never appear in a process list.
    """
    command = manifest["command"]
    box = manifest.get("container") or {}
    runtime = box.get("runtime", "none")
    workdir = manifest["workdir"]
    if runtime == "docker":
        argv = ["docker", "run", "--rm", "--network", "host", "--ipc", "host", "--init",
                "-v", f"{workdir}:{workdir}", "-w", workdir]
        if box.get("gpus", True):
            argv += ["--gpus", "all"]
        for name in env_names:
            argv += ["-e", name]
        argv += list(box.get("args") or [])
        return [*argv, box["image"], "sh", "-c", command]
    if runtime == "apptainer":
        image = box["image"]
        uri = image if "://" in image else "docker://" + image
        return ["apptainer", "exec", "--nv", "--pwd", workdir, "--bind", workdir, uri, "sh", "-c", command]
    return ["sh", "-c", command]


def registry_login(box: dict, env: dict) -> None:
    """``docker login`` with the job's registry secret, the password on stdin."""
    reg = box.get("registry") or {}
    if not reg or box.get("runtime") != "docker":
        return
    password = env.get(reg.get("password_env", ""), "")
    subprocess.run(["docker", "login", "--username", reg["username"], "--password-stdin", reg["server"]],
                   input=password.encode(), check=True, capture_output=True)


class Runner:
    """The command's process group: started, watched, stopped (TERM, then KILL after a grace period)."""

    POLL_S = 0.2

    def __init__(self, argv: list[str], env: dict, cwd: str, log: Log, grace: float) -> None:
        self.log = log
        self.grace = grace
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.pumps = [log.pump(self.proc.stdout, "out"), log.pump(self.proc.stderr, "err")]
        self.reason = ""
        self.stop_at = 0.0

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def request_stop(self, reason: str) -> None:
        """TERM the command's process group now; ``wait`` KILLs it if it outlives the grace period.

        Safe in a signal handler: it only sends a signal and sets two fields.
        """
        if not self.reason:
            self.reason = reason
            self.stop_at = time.monotonic()
        self.signal(signal.SIGTERM)

    def wait(self, max_duration: float | None) -> int:
        started = time.monotonic()
        killed = False
        while True:
            try:
                code = self.proc.wait(timeout=self.POLL_S)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if max_duration is not None and not self.reason and now - started >= max_duration:
                    self.log.line("lockstep", f"max_duration of {max_duration:g} s reached: stopping the command")
                    self.request_stop("max_duration")
                if self.reason and not killed and now - self.stop_at >= self.grace:
                    self.signal(signal.SIGKILL)
                    killed = True
        for t in self.pumps:
            t.join(timeout=10)
        return code


def watch_fence(manifest: dict, runner: Runner, log: Log, every_s: float = 2.0) -> None:
    """Fencing (issue 24; docs/runtime.md): where the job's status location holds a fence (``logs.fence``, a
    file naming the attempt the broker runs now), an attempt it names a later one than this has been superseded
    (requeued and placed again while this one ran on, e.g. on a node Slurm lost): its command is stopped as for
    a signal to the job, and the wrapper exits. Self-contained: one thread, reading one small file."""
    path = (manifest.get("logs") or {}).get("fence")
    mine = int((manifest.get("env") or {}).get("LOCKSTEP_ATTEMPT") or 0)
    if not path or not mine:
        return

    def watch() -> None:
        while runner.proc.poll() is None:
            try:
                with open(path, encoding="utf-8") as fh:
                    current = int(fh.read().strip() or 0)
            except (OSError, ValueError):
                current = 0
            if current > mine:
                log.line("lockstep", f"superseded by attempt {current}: stopping attempt {mine}")
                runner.request_stop("signal")
                return
            time.sleep(every_s)

    threading.Thread(target=watch, name="lockstep-fence", daemon=True).start()


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: 128 + N for a command killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


# --------------------------------------------------------------------------- status and end


def write_status(manifest: dict, rank: int, status: dict) -> None:
    body = json.dumps(status, sort_keys=True).encode()
    logs = manifest.get("logs") or {}
    status_dir = logs.get("status_dir")
    if status_dir:
        os.makedirs(status_dir, exist_ok=True)
        tmp = os.path.join(status_dir, f".status-{rank}.json.tmp")
        with open(tmp, "wb") as fh:
            fh.write(body)
        os.replace(tmp, os.path.join(status_dir, f"status-{rank}.json"))
    url = (logs.get("status_put_urls") or {}).get(str(rank))
    if url:
        try:
            put(url, body, "application/json")
        except Exception as exc:
            sys.stderr.write(f"lockstep-run: status upload failed: {type(exc).__name__}\n")


def shut_down(manifest: dict) -> None:
    argv = manifest.get("shutdown")
    if argv:
        sys.stdout.flush()
        subprocess.run(list(argv), check=False)


def main(argv: list[str] | None = None, environ: dict | None = None) -> int:
    argv = sys.argv if argv is None else argv
    environ = dict(os.environ if environ is None else environ)
    manifest = load_manifest(argv, environ)
    started = log_time()
    job_env = {k: str(v) for k, v in (manifest.get("env") or {}).items()}
    secrets = {k: str(v) for k, v in (manifest.get("secrets") or {}).items()}
    manifest.setdefault("workdir", os.path.join(environ.get("TMPDIR", "/tmp"),
                                                f"lockstep-{job_env.get('LOCKSTEP_JOB_ID', 'job')}"))
    workdir = manifest["workdir"]
    os.makedirs(workdir, exist_ok=True)
    try:
        rdzv = rendezvous(manifest, environ)
    except (WrapperError, OSError, ValueError) as exc:  # no rank: report as rank 0's failure so the broker hears of it
        rdzv, failure = {"LOCKSTEP_NODE_RANK": "0"}, str(exc)
    else:
        failure = ""
    rank = int(rdzv["LOCKSTEP_NODE_RANK"])
    log = Log(manifest, list(secrets.values()), rank)
    log.start()
    runner = None
    terminated = []

    def on_term(signum, _frame) -> None:  # preemption, scancel, spot interruption
        terminated.append(signum)
        if runner is not None:
            runner.request_stop("signal")

    signal.signal(signal.SIGTERM, on_term)
    code, reason = WRAPPER_FAILED, "error"
    try:
        if failure:
            raise RuntimeError(failure)
        env = dict(environ)
        env.pop("LOCKSTEP_MANIFEST", None)
        env.update(job_env)
        env.update(rdzv)
        env["LOCKSTEP_WORKDIR"] = workdir
        if manifest.get("files"):
            n = unpack_files(manifest["files"], workdir)
            log.line("lockstep", f"unpacked {n} file(s) into {workdir}")
        env.update(fetch_data(manifest.get("data") or {}, workdir))
        if manifest.get("checkpoint_dir"):
            os.makedirs(manifest["checkpoint_dir"], exist_ok=True)
        env.update(secrets)
        names = sorted(set(job_env) | set(rdzv) | set(secrets) | {
            k for k in env if k.startswith("LOCKSTEP_")} - {"LOCKSTEP_MANIFEST"})
        box = manifest.get("container") or {}
        registry_login(box, env)
        password_env = (box.get("registry") or {}).get("password_env")
        if password_env:  # used to log in; not the command's business
            env.pop(password_env, None)
            names = [n for n in names if n != password_env]
        cmd = command_argv(manifest, names)
        log.line("lockstep", f"node {rank} of {rdzv['LOCKSTEP_NUM_NODES']} (head {rdzv['LOCKSTEP_HEAD_ADDR']}): "
                             f"starting {shlex.join(cmd[:1])}")
        runner = Runner(cmd, env, workdir, log, float(manifest.get("grace_s", 30)))
        watch_fence(manifest, runner, log)
        if terminated:  # the signal came while the command was starting
            runner.request_stop("signal")
        max_duration = manifest.get("max_duration_s")
        returncode = runner.wait(float(max_duration) if max_duration else None)
        if runner.reason == "signal":
            log.line("lockstep", "the command was stopped by a signal to the job (preemption or cancel)")
        code = exit_code_of(returncode)
        reason = runner.reason or "exited"
    except Exception as exc:  # the wrapper's own failure still ends with a status
        log.line("lockstep", f"could not run the command: {type(exc).__name__}: {exc}")
    status = {"exit_code": code, "reason": reason, "rank": rank, "host": socket.gethostname(),
              "started_at": started, "ended_at": log_time(), "last_lines": log.tail[-10:]}
    log.line("lockstep", f"command ended: exit code {code} ({reason})")
    log.close()
    write_status(manifest, rank, status)
    sys.stdout.write(EXIT_MARKER + json.dumps(status, sort_keys=True) + "\n")
    sys.stdout.flush()
    shut_down(manifest)
    return code


if __name__ == "__main__":
    sys.exit(main())
