"""The boot scripts around the wrapper (issue 27): they do not exec it, pass signals on to it, and end the
machine themselves when the wrapper could not — run for real (bash for AWS's user data, sh for Vast's
entrypoint), with ``shutdown`` and ``poweroff`` replaced by scripts that take notes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from providers.aws.requests import boot_script
from providers.runtime import wrapper
from providers.runtime.manifest import RunRequest, exit_nonce
from providers.vast.runtime import BOOT_ARGS, node_env, node_exit, node_manifest, single_node

NOTE = """#!/bin/sh
echo "{name} $*" >> {calls}
exit {code}
"""


def fake_bin(root: Path, **programs: int) -> Path:
    """Programs that note their call in ``root/calls`` and exit with the given code."""
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, code in programs.items():
        path = bin_dir / name
        path.write_text(NOTE.format(name=name, calls=root / "calls", code=code))
        path.chmod(0o755)
    return bin_dir


def calls(root: Path) -> list[str]:
    path = root / "calls"
    return path.read_text().splitlines() if path.exists() else []


class AwsBoot:
    """The user data of one attempt, run with bash as cloud-init would; wrapper and manifest from file:// URLs."""

    def __init__(self, root: Path, command: str, *, shutdown_code: int = 0, **extra: Any) -> None:
        self.root = root
        manifest = {"command": command, "workdir": str(root / "work"), "exit_nonce": "abc",
                    "logs": {"file": str(root / "log.txt"), "status_dir": str(root / "status"), "stdout": True},
                    "shutdown": ["shutdown", "-h", "now"], "shutdown_fallbacks": [["poweroff", "-f"]],
                    "shutdown_attempts": 1, "grace_s": 5, **extra}
        (root / "manifest.json").write_text(json.dumps(manifest))
        self.script = root / "user-data.sh"
        self.script.write_text(boot_script("j1", 1, wrapper_url=f"file://{wrapper.__file__}",
                                           manifest_url=f"file://{root / 'manifest.json'}"))
        self.bin = fake_bin(root, shutdown=shutdown_code, poweroff=0)
        self.env = {"PATH": f"{self.bin}:{os.path.dirname(sys.executable)}:/usr/bin:/bin", "LANG": "C.UTF-8",
                    "LOCKSTEP_DIR": str(root / "d"), "LOCKSTEP_SYSRQ": "0", "HOME": str(root)}

    def start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["bash", str(self.script)], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)

    def status(self) -> dict[str, Any]:
        return json.loads((self.root / "status" / "status-0.json").read_text())


def test_aws_boot_runs_the_wrapper_which_shuts_down_once(tmp_path: Path) -> None:
    boot = AwsBoot(tmp_path, "echo hello; exit 4")
    proc = boot.start()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 4, out
    assert boot.status()["exit_code"] == 4
    assert calls(tmp_path) == ["shutdown -h now"]  # the wrapper's; the boot script saw its mark
    assert not (tmp_path / "d" / "manifest.json").exists()


def test_aws_boot_shuts_down_when_the_wrapper_dies(tmp_path: Path) -> None:
    boot = AwsBoot(tmp_path, "echo about-to-kill; kill -9 $PPID")
    proc = boot.start()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGKILL
    assert b"without shutting the machine down" in out
    assert calls(tmp_path) == ["shutdown -h now"]  # the boot script's own


def test_aws_boot_falls_back_to_poweroff(tmp_path: Path) -> None:
    boot = AwsBoot(tmp_path, "kill -9 $PPID", shutdown_code=1)
    proc = boot.start()
    out, _ = proc.communicate(timeout=60)
    assert calls(tmp_path) == ["shutdown -h now", "poweroff -f"], out


def test_aws_boot_passes_term_on_to_the_wrapper(tmp_path: Path) -> None:
    boot = AwsBoot(tmp_path, "trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 0.1; done")
    proc = boot.start()
    assert proc.stdout is not None
    for raw in proc.stdout:
        if raw.rstrip().endswith(b"out ready"):
            break
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 9
    st = boot.status()
    assert (st["exit_code"], st["reason"]) == (9, "signal")
    assert calls(tmp_path) == ["shutdown -h now"]


def test_aws_boot_refuses_a_python_older_than_3_6(tmp_path: Path) -> None:
    boot = AwsBoot(tmp_path, "echo never")
    old = boot.bin / "python3"
    old.write_text("#!/bin/sh\n[ \"$1\" = -V ] && echo 'Python 3.5.2'\nexit 1\n")
    old.chmod(0o755)
    proc = boot.start()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert b"python3 is older than 3.6 (Python 3.5.2)" in out
    assert calls(tmp_path) == ["shutdown -h now"]


# --------------------------------------------------------------------------- Vast's entrypoint


def vast_boot(tmp_path: Path, command: str, path: str | None = None) -> tuple[int, str, str]:
    run = RunRequest(job_id="j7", attempt=2, command=command)
    env = node_env(run, node_manifest(run, rendezvous=single_node()))
    env.update({"PATH": path or f"{os.path.dirname(sys.executable)}:/usr/bin:/bin", "TMPDIR": str(tmp_path),
                "LANG": "C.UTF-8"})
    proc = subprocess.run(["/bin/sh", *BOOT_ARGS], env=env, capture_output=True, timeout=60)
    return proc.returncode, proc.stdout.decode(), exit_nonce("j7", 2)


def test_vast_boot_ends_with_the_nonced_exit_line(tmp_path: Path) -> None:
    code, out, nonce = vast_boot(tmp_path, "echo hi; exit 4")
    assert code == 4
    assert f"LOCKSTEP-EXIT {nonce} " in out and "LOCKSTEP-BEAT " in out
    end = node_exit(out, "", nonce)
    assert end.exit_code == 4 and end.reason.value == "exited"
    assert node_exit(out, "", "wrong-nonce").exit_code == wrapper.WRAPPER_FAILED  # no line with that nonce


def test_vast_boot_reports_a_wrapper_that_died(tmp_path: Path) -> None:
    code, out, nonce = vast_boot(tmp_path, "echo dying; kill -9 $PPID")
    assert code == 128 + signal.SIGKILL
    end = node_exit(out, "", nonce)
    assert end.exit_code == 137 and end.reason.value == "error"
    assert "without its exit status" in end.last_lines[-1]


def test_vast_boot_without_python(tmp_path: Path) -> None:
    code, out, nonce = vast_boot(tmp_path, "echo never", path=str(tmp_path / "empty"))
    assert code == wrapper.WRAPPER_FAILED
    end = node_exit(out, "", nonce)
    assert end.exit_code == wrapper.WRAPPER_FAILED and "no python3" in end.last_lines[-1]
