"""The wrapper runs on the Python a job's image or host has: 3.6 and later (issue 27). No Python older than
the test's own is installed here, so its source is checked: vermin (every module, function and keyword it
uses, against the version that brought it) and Python's own parser in 3.6 mode."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from providers.runtime import wrapper

SOURCE = Path(wrapper.__file__)


def test_the_wrapper_parses_as_python_3_6() -> None:
    tree = ast.parse(SOURCE.read_text(), feature_version=(3, 6))
    futures = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    assert not futures, "from __future__ import annotations is a SyntaxError before 3.7"


def test_the_wrapper_needs_nothing_newer_than_3_6() -> None:
    vermin = shutil.which("vermin") or pytest.skip("vermin is not installed (pip install -e '.[dev]')")
    proc = subprocess.run([vermin, "--no-tips", "--violations", "--eval-annotations", "-t=3.6-", str(SOURCE)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_wrapper_runs_in_dev_mode_with_every_warning_an_error(tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text('{"command": "echo hi", "workdir": "%s", "logs": {"stdout": true}}' % (tmp_path / "w"))
    proc = subprocess.run([sys.executable, "-X", "dev", "-W", "error", str(SOURCE), str(manifest)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "out hi" in proc.stdout
