"""A real ``lockstep serve`` process on loopback, for tests that kill it (SIGKILL) and start it again on the
same store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def serve_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env.update(LOCKSTEP_LOG_LEVEL="WARNING", LOCKSTEP_CATALOG__ENABLED="true", PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


class Served:
    """``lockstep --db URL serve --port 0``; ``url`` once it said where it serves."""

    def __init__(self, db_url: str, log: Path, **env: str) -> None:
        self.db_url, self.log, self.env = db_url, log, serve_env(**env)
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> str:
        with self.log.open("a") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "broker", "--db", self.db_url, "serve", "--port", "0"],
                                         stdout=subprocess.PIPE, stderr=err, text=True, env=self.env, cwd=ROOT)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("lockstep: serving on "), line + self.log.read_text()[-3000:]
        self.url = line.split()[-1]
        return self.url

    def kill(self) -> int:
        """SIGKILL: no cleanup, no last write."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
