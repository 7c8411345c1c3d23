"""The in-job wrapper (providers/runtime/wrapper.py), run as a real process, as a node runs it.

Its sinks are real: a directory for status files, and presigned S3 URLs served by moto's server on loopback.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from providers.runtime import wrapper

WRAPPER = Path(wrapper.__file__)
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (out|err|lockstep) (.*)$")


def run(manifest: dict[str, Any], tmp_path: Path, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKSTEP_", "SLURM_"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, str(WRAPPER), str(path)], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def base(tmp_path: Path, command: str, **extra: Any) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "command": command,
        "workdir": str(tmp_path / "work"),
        "env": {"LOCKSTEP_JOB_ID": "j1", "LOCKSTEP_ATTEMPT": "1"},
        "logs": {"file": str(tmp_path / "logs" / "rank-0.log"), "status_dir": str(tmp_path / "status"),
                 "stdout": True, "interval_s": 0.2},
    }
    manifest.update(extra)
    return manifest


def log_lines(tmp_path: Path, rank: int = 0) -> list[tuple[str, str]]:
    out = []
    for raw in (tmp_path / "logs" / f"rank-{rank}.log").read_text().splitlines():
        m = LINE.match(raw)
        assert m, f"not a time-stamped line: {raw!r}"
        out.append((m.group(1), m.group(2)))
    return out


def status(tmp_path: Path, rank: int = 0) -> dict[str, Any]:
    return json.loads((tmp_path / "status" / f"status-{rank}.json").read_text())


def test_exit_code_lines_and_status(tmp_path: Path) -> None:
    proc = run(base(tmp_path, "echo one; echo two >&2; echo three; exit 3"), tmp_path)
    assert proc.returncode == 3
    lines = log_lines(tmp_path)
    assert ("out", "one") in lines and ("err", "two") in lines and ("out", "three") in lines
    st = status(tmp_path)
    assert st["exit_code"] == 3 and st["reason"] == "exited" and st["rank"] == 0
    assert "three" in st["last_lines"]
    marker = [ln for ln in proc.stdout.splitlines() if ln.startswith(wrapper.EXIT_MARKER)]
    assert len(marker) == 1 and json.loads(marker[0][len(wrapper.EXIT_MARKER):])["exit_code"] == 3


def test_env_secrets_reach_the_command_and_are_masked(tmp_path: Path) -> None:
    secret = "s3cr3t-value-9f8e7d"
    manifest = base(tmp_path, 'echo "user=$GREETING"; printf %s "$API_TOKEN" | sha256sum; echo "leak: $API_TOKEN"',
                    secrets={"API_TOKEN": secret})
    manifest["env"]["GREETING"] = "hello world"
    proc = run(manifest, tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "logs" / "rank-0.log").read_text()
    assert "user=hello world" in text
    assert hashlib.sha256(secret.encode()).hexdigest() in text  # the command saw the real value
    assert "leak: " + wrapper.MASK in text
    for blob in (text, proc.stdout, proc.stderr, (tmp_path / "status" / "status-0.json").read_text()):
        assert secret not in blob


def test_max_duration_stops_the_command(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = run(base(tmp_path, "echo started; sleep 60; echo never", max_duration_s=1, grace_s=2), tmp_path)
    assert time.monotonic() - started < 30
    st = status(tmp_path)
    assert st["reason"] == "max_duration"
    assert st["exit_code"] == 128 + signal.SIGTERM == proc.returncode
    assert ("out", "never") not in log_lines(tmp_path)


def test_a_command_that_ignores_term_is_killed(tmp_path: Path) -> None:
    proc = run(base(tmp_path, "trap '' TERM; echo stubborn; sleep 60", max_duration_s=1, grace_s=1), tmp_path)
    assert proc.returncode == 128 + signal.SIGKILL
    assert status(tmp_path)["reason"] == "max_duration"


def test_term_is_passed_on_to_the_command(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(base(tmp_path, "trap 'echo got-term; exit 7' TERM; echo ready; "
                                              "while :; do sleep 0.1; done", grace_s=5)))
    proc = subprocess.Popen([sys.executable, str(WRAPPER), str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for raw in proc.stdout:
        if raw.rstrip().endswith("out ready"):
            break
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7
    st = status(tmp_path)
    assert st["reason"] == "signal" and st["exit_code"] == 7
    assert ("out", "got-term") in log_lines(tmp_path)


def _tarball(files: dict[str, str]) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


def test_files_are_unpacked_into_the_workdir(tmp_path: Path) -> None:
    files = _tarball({"train.py": "print('training')\n", "conf/lr.txt": "0.1\n"})
    proc = run(base(tmp_path, 'cat conf/lr.txt; python3 train.py; echo "wd=$LOCKSTEP_WORKDIR"', files=files),
               tmp_path)
    assert proc.returncode == 0, proc.stdout
    lines = log_lines(tmp_path)
    assert ("out", "0.1") in lines and ("out", "training") in lines
    assert ("out", f"wd={tmp_path / 'work'}") in lines


def test_files_that_leave_the_workdir_are_refused(tmp_path: Path) -> None:
    files = _tarball({"../escape.txt": "x"})
    proc = run(base(tmp_path, "echo ran", files=files), tmp_path)
    assert proc.returncode == wrapper.WRAPPER_FAILED
    assert not (tmp_path / "escape.txt").exists()
    st = status(tmp_path)
    assert st["reason"] == "error" and ("out", "ran") not in log_lines(tmp_path)


def test_manifest_from_the_environment_gzip_base64(tmp_path: Path) -> None:
    blob = base64.b64encode(gzip.compress(json.dumps(base(tmp_path, "echo from-env; exit 0")).encode())).decode()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["LOCKSTEP_MANIFEST"] = blob
    proc = subprocess.run([sys.executable, str(WRAPPER)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0
    assert ("out", "from-env") in log_lines(tmp_path)


RDZV_CMD = 'echo "rank=$LOCKSTEP_NODE_RANK n=$LOCKSTEP_NUM_NODES head=$LOCKSTEP_HEAD_ADDR ' \
           'addrs=$LOCKSTEP_NODE_ADDRS gpn=$LOCKSTEP_GPUS_PER_NODE port=$LOCKSTEP_RDZV_PORT master=$MASTER_ADDR"'


def test_rendezvous_from_a_peer_list(tmp_path: Path) -> None:
    peers = tmp_path / "peers.json"
    peers.write_text(json.dumps({"nodes": [{"id": "i-aaa", "addr": "10.0.0.5"}, {"id": "i-bbb", "addr": "10.0.0.9"}]}))
    manifest = base(tmp_path, RDZV_CMD, rendezvous={"mode": "peers", "peers_file": str(peers), "gpus_per_node": 8,
                                                    "port": 29400})
    manifest["logs"]["file"] = str(tmp_path / "logs" / "rank-1.log")
    proc = run(manifest, tmp_path, env={"LOCKSTEP_NODE_ID": "i-bbb"})
    assert proc.returncode == 0, proc.stdout
    assert ("out", "rank=1 n=2 head=10.0.0.5 addrs=10.0.0.5,10.0.0.9 gpn=8 port=29400 master=10.0.0.5") in \
        log_lines(tmp_path, 1)
    assert status(tmp_path, 1)["rank"] == 1


def test_rendezvous_from_slurm_environment(tmp_path: Path) -> None:
    manifest = base(tmp_path, RDZV_CMD, rendezvous={"mode": "env", "gpus_per_node": 4})
    manifest["logs"]["file"] = str(tmp_path / "logs" / "rank-{rank}.log")
    proc = run(manifest, tmp_path, env={"LOCKSTEP_NODE_ADDRS": "192.168.1.1,192.168.1.2", "SLURM_NODEID": "1"})
    assert proc.returncode == 0, proc.stdout
    assert ("out", "rank=1 n=2 head=192.168.1.1 addrs=192.168.1.1,192.168.1.2 gpn=4 port=29500 "
                   "master=192.168.1.1") in log_lines(tmp_path, 1)


def test_a_missing_peer_list_fails_with_a_status(tmp_path: Path) -> None:
    manifest = base(tmp_path, "echo never", rendezvous={"mode": "peers", "peers_file": str(tmp_path / "none"),
                                                        "wait_s": 1})
    proc = run(manifest, tmp_path, env={"LOCKSTEP_NODE_ID": "i-x"})
    assert proc.returncode == wrapper.WRAPPER_FAILED
    st = status(tmp_path)
    assert st["reason"] == "error"
    assert any("peer list" in line for line in st["last_lines"])


@pytest.fixture
def s3(aws_moto: str) -> Any:
    client = botocore.session.get_session().create_client(
        "s3", region_name="us-east-1", endpoint_url=aws_moto, aws_access_key_id="testing",
        aws_secret_access_key="testing")
    client.create_bucket(Bucket="lockstep-runs")
    return client


def test_logs_and_status_go_to_presigned_urls(tmp_path: Path, s3: Any) -> None:
    def url(method: str, key: str) -> str:
        return s3.generate_presigned_url(method, Params={"Bucket": "lockstep-runs", "Key": key}, ExpiresIn=600)

    secret = "tok-0123456789"
    manifest = base(tmp_path, "for i in 1 2 3; do echo line-$i; sleep 0.3; done; echo $T; exit 4",
                    secrets={"T": secret})
    manifest["logs"] = {"file": str(tmp_path / "logs" / "rank-0.log"), "stdout": False, "interval_s": 0.2,
                        "put_urls": {"0": url("put_object", "j1/1/rank-0/log")},
                        "status_put_urls": {"0": url("put_object", "j1/1/rank-0/status.json")}}
    proc = run(manifest, tmp_path)
    assert proc.returncode == 4
    logged = s3.get_object(Bucket="lockstep-runs", Key="j1/1/rank-0/log")["Body"].read().decode()
    assert [ln.split(" ", 2)[2] for ln in logged.splitlines() if " out " in ln] == \
        ["line-1", "line-2", "line-3", wrapper.MASK]
    st = json.loads(s3.get_object(Bucket="lockstep-runs", Key="j1/1/rank-0/status.json")["Body"].read())
    assert st["exit_code"] == 4 and st["reason"] == "exited"
    assert secret not in logged and secret not in json.dumps(st) and secret not in proc.stdout
