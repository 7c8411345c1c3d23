"""`bench parse-nccl` and `probe` through typer's CliRunner: exit codes, JSON shape, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from broker.cli.bench import app, probe_command

runner = CliRunner()


@pytest.fixture(scope="module")
def nv4(shared_data: Path) -> Path:
    return shared_data / "nccl-tests" / "a40_nvlink_pair_2gpu_nv4.txt"


def test_parse_nccl_json(nv4: Path) -> None:
    result = runner.invoke(app, ["parse-nccl", str(nv4), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["avg_busbw_gbps"] == 47.4509
    assert len(doc["rows"]) == 8
    assert [r["in_place"] for r in doc["rows"]] == [False, True] * 4
    assert doc["rows"][-1]["busbw_gbps"] == 47.48 and doc["rows"][-1]["size_bytes"] == 8589934592
    for row in doc["rows"]:
        assert {"size_bytes", "time_us", "algbw_gbps", "busbw_gbps", "in_place"} <= row.keys()


def test_parse_nccl_table(nv4: Path) -> None:
    result = runner.invoke(app, ["parse-nccl", str(nv4)])
    assert result.exit_code == 0, result.output
    assert "avg bus bandwidth 47.4509 GB/s" in result.stdout
    assert "180860" in result.stdout and "8G" in result.stdout  # the 8 GiB row, out-of-place time


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda d: d / "absent.txt", "no such file"),
        (lambda d: d, "is a directory"),
        (lambda d: _write(d / "empty.txt", b""), "empty"),
        (lambda d: _write(d / "binary.bin", bytes(range(256)) * 8), "no result rows"),
        (lambda d: _write(d / "cut.txt", b"       8   2  float  sum  -1  10.1  0.00\n"), "line 1: expected"),
    ],
)
def test_bad_files_exit_2_with_one_line(tmp_path: Path, make, needle: str) -> None:
    path = make(tmp_path)
    result = runner.invoke(app, ["parse-nccl", str(path), "--json"])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.stderr


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def lockstep_like() -> typer.Typer:
    """probe_command registered the way the main CLI mounts it (`lockstep probe`)."""
    root = typer.Typer()

    @root.callback()
    def _root() -> None:
        pass

    root.command("probe")(probe_command)
    return root


def test_probe_command_json(lockstep_like: typer.Typer, tmp_path: Path) -> None:
    result = runner.invoke(lockstep_like, ["probe", "--quick", "--disk-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["quick"] is True and doc["cpu"]["count"] >= 1
    assert doc["disk"]["write_mbps"] > 0 and isinstance(doc["gpus"], list)


def test_probe_command_table(lockstep_like: typer.Typer, tmp_path: Path) -> None:
    result = runner.invoke(lockstep_like, ["probe", "--quick", "--table", "--disk-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "MB/s" in result.stdout and "RAM" in result.stdout
