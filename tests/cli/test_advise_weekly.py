"""`lockstep advise --gpu-hours-per-week N --peak-gpus P`: rent, hybrid or own before there is a history or a
trace, with the same model (issue 29). Bad combinations are exit 2 naming the flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.advise import usage_from_weekly
from broker.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]


def advise(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """The real command line, as a user runs it (its one-line errors and exit codes come from the entry point)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["LOCKSTEP_DB"] = f"sqlite:///{tmp_path / 'cli.db'}"
    r = subprocess.run([sys.executable, "-m", "broker", "advise", *args], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=120)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.parametrize(("weekly", "peak"), [(200, 16), (3000, 24), (8000, 64), (168 * 8, 8)])
def test_the_stated_load_keeps_its_total_and_its_peak(weekly: float, peak: int) -> None:
    u = usage_from_weekly(weekly, peak)
    assert u.gpu_hours_per_week == pytest.approx(weekly) and u.peak_gpus == pytest.approx(peak)
    assert float(u.profile.max()) <= peak + 1e-9 and u.span_hours == 168


def test_a_small_load_rents_and_a_steady_large_one_owns(tmp_path: Path) -> None:
    code, out, err = advise(tmp_path, "--gpu-hours-per-week", "200", "--peak-gpus", "16", "--json")
    assert code == 0, err
    small = json.loads(out)
    assert small["usage"]["source"] == "stated load" and small["usage"]["gpu_hours_per_week"] == 200
    assert small["usage"]["peak_gpus"] == 16 and small["recommendation"] == "rent"

    code, out, err = advise(tmp_path, "--gpu-hours-per-week", "10000", "--peak-gpus", "64", "--json")
    assert code == 0, err
    big = json.loads(out)
    assert big["recommendation"] in ("hybrid", "own"), big["reason"]
    assert {p["name"] for p in big["plans"]} >= {"rent", "own for peak"}

    code, out, err = advise(tmp_path, "--gpu-hours-per-week", "200", "--peak-gpus", "16")
    assert code == 0 and "200 GPU-hours a week" in out and "recommendation: rent" in out, err


@pytest.mark.parametrize(("args", "named"), [
    (["--peak-gpus", "8"], "--gpu-hours-per-week"),
    (["--gpu-hours-per-week", "100"], "--peak-gpus"),
    (["--gpu-hours-per-week", "100", "--peak-gpus", "8", "--from-history"], "--gpu-hours-per-week"),
    (["--gpu-hours-per-week", "2000", "--peak-gpus", "8"], "--peak-gpus"),  # more than 8 GPUs all week
    (["--gpu-hours-per-week", "0", "--peak-gpus", "8"], "--gpu-hours-per-week"),
    (["--gpu-hours-per-week", "100", "--peak-gpus", "0"], "--peak-gpus"),
])
def test_bad_combinations_are_exit_2_naming_the_flags(tmp_path: Path, args: list[str], named: str) -> None:
    code, out, err = advise(tmp_path, *args)
    assert code == 2, out
    assert named in err and len(err.strip().splitlines()) == 1, err


def test_the_model_rejects_a_load_above_its_peak() -> None:
    with pytest.raises(SpecError) as e:
        usage_from_weekly(169, 1)
    assert e.value.field == "--gpu-hours-per-week"
