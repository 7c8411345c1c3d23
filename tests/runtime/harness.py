"""Running the in-job wrapper as a node runs it, with an end-of-job command that only takes notes.

The wrapper is a real process (``python3 wrapper.py manifest.json``); its ``shutdown`` and
``shutdown_fallbacks`` are small scripts that append a line to ``calls`` (and fail on purpose when the
test asks), so a test can tell that the machine would have been shut down, how often and by what. Nothing
here ever runs the host's own ``shutdown`` or ``poweroff``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from providers.runtime import wrapper

WRAPPER = Path(wrapper.__file__)

NOTE_SCRIPT = """#!/bin/sh
# {name}: a note of the call (and of whether the file given as $1 exists), then exit {code}
if [ -n "$1" ] && [ -e "$1" ]; then seen=present; else seen=absent; fi
echo "{name} $seen" >> {calls}
exit {code}
"""


class Node:
    """One wrapper run in ``root``: its manifest, its fake end-of-job commands, what they noted."""

    def __init__(self, root: Path, command: str, *, shutdown_code: int = 0, fallback_code: int = 0,
                 **extra: Any) -> None:
        self.root = root
        self.calls = root / "calls"
        self.end_mark = root / "end-mark"
        bin_dir = root / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        for name, code in (("fake-shutdown", shutdown_code), ("fake-poweroff", fallback_code)):
            path = bin_dir / name
            path.write_text(NOTE_SCRIPT.format(name=name, calls=self.calls, code=code))
            path.chmod(0o755)
        self.manifest: dict[str, Any] = {
            "command": command,
            "workdir": str(root / "work"),
            "env": {"LOCKSTEP_JOB_ID": "j1", "LOCKSTEP_ATTEMPT": "1"},
            "logs": {"file": str(root / "logs" / "rank-{rank}.log"), "status_dir": str(root / "status"),
                     "stdout": True, "interval_s": 0.2},
            "shutdown": [str(bin_dir / "fake-shutdown")],
            "shutdown_fallbacks": [[str(bin_dir / "fake-poweroff")]],
            "shutdown_attempts": 2,
            "shutdown_retry_s": 0.05,
            "exit_nonce": "n0nce",
            "heartbeat_s": 0.2,
        }
        self.manifest.update(extra)
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKSTEP_", "SLURM_"))}
        env[wrapper.END_MARK_VAR] = str(self.end_mark)
        env.update(extra or {})
        return env

    def start(self, *, env: dict[str, str] | None = None, stdout: Any = subprocess.PIPE,
              preexec: Any = None) -> subprocess.Popen[bytes]:
        path = self.root / "manifest.json"
        path.write_text(json.dumps(self.manifest))
        self.proc = subprocess.Popen([sys.executable, str(WRAPPER), str(path)], stdout=stdout,
                                     stderr=subprocess.PIPE, env=self.env(env), preexec_fn=preexec)
        return self.proc

    def run(self, timeout: float = 60, **kw: Any) -> tuple[int, bytes, bytes]:
        proc = self.start(**kw)
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out or b"", err or b""

    def status(self, rank: int = 0) -> dict[str, Any]:
        return json.loads((self.root / "status" / f"status-{rank}.json").read_text())

    def noted(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def shut_down(self) -> bool:
        """Did the machine go down: the shutdown, or a fallback, succeeded?"""
        return bool(self.noted())

    def log_text(self, rank: int = 0) -> str:
        return (self.root / "logs" / f"rank-{rank}.log").read_text(errors="replace")

    def marks(self) -> list[str]:
        return self.end_mark.read_text().splitlines() if self.end_mark.exists() else []

    def wait_for_handlers(self, limit_s: float = 30) -> None:
        """Until the wrapper catches TERM (its handlers are installed): /proc's SigCgt says so."""
        assert self.proc is not None
        bit = 1 << (signal.SIGTERM - 1)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                text = Path(f"/proc/{self.proc.pid}/status").read_text()
            except OSError:
                break
            caught = int(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("SigCgt:")), 16)
            if caught & bit:
                return
            time.sleep(0.02)
        raise AssertionError("the wrapper never installed its signal handlers")


def alive(pid: int) -> bool:
    """Is ``pid`` a live process (not gone, not a zombie)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"


def wait_for_file(path: Path, limit_s: float = 30) -> str:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


class Sink:
    """A loopback HTTP server that keeps every PUT (path → bodies, in order) and serves ``GET /data.bin``."""

    def __init__(self, data: bytes = b"") -> None:
        import http.server
        import threading

        self.puts: dict[str, list[bytes]] = {}
        self.order: list[str] = []  # every PUT's path, in the order they arrived
        self.busy = 0  # log PUTs in progress now, and the most at once
        self.most_busy = 0
        self.lock = threading.Lock()
        self.delay_s = 0.0
        self.data = data
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                is_log = "/log" in self.path
                with sink.lock:
                    sink.busy += is_log
                    sink.most_busy = max(sink.most_busy, sink.busy)
                    sink.order.append(self.path)
                    sink.puts.setdefault(self.path, []).append(body)
                time.sleep(sink.delay_s)
                with sink.lock:
                    sink.busy -= is_log
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                if self.path != "/data.bin":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(sink.data)))
                self.end_headers()
                self.wfile.write(sink.data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
