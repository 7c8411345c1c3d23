"""The bench/ scripts still run and print their figures (tiny sizes; no timings asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ingest_bench_prints_rates_and_latencies() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ingest.py"), "--points", "6000", "--runs", "2", "--backends", "sqlite"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    stored = int(re.search(r"sqlite\s+ingest: ([\d,]+) points", out).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert stored == 5920  # 1,480 series x 4 points: every generated point is a change
    assert "re-ingest of the last batch stored 0 (dedup)" in out
    assert re.search(r"reference, same run: bare rows into an unindexed table [\d,]+ points/s \(ingest = [\d.]+×", out)
    assert re.search(r"load average [\d.]+ / [\d.]+ / [\d.]+ \(1 / 5 / 15 min\) at the end", out)
    assert re.search(r"7-day history for 'H100-SXM': [\d,]+ points in \d+ series", out)
    assert len(re.findall(r"as PriceSeries \(columns\): median [\d.]+ ms", out)) == 2
    assert len(re.findall(r"as PricePoint per point:  median [\d.]+ ms", out)) == 2


def test_place_bench_places_every_job_and_prints_the_floor() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "place.py"), "--sizes", "40", "--backends", "sqlite"],
        capture_output=True, text=True, timeout=300, check=True, cwd=ROOT,
    ).stdout
    # pending, pass s, CPU s, placed/s, floor ms, × floor, writes, reads, placed, left, queued/s
    row = re.search(r"^sqlite\s+40\s+(?:[\d.,]+\s+){5}([\d.]+)\s+[\d.]+\s+(\d+)\s+(\d+)\s", out, re.M)
    assert row is not None, out
    assert (row.group(2), row.group(3)) == ("40", "0")  # all 40 placed in one pass, none left
    assert float(row.group(1)) <= 5  # write transactions per placement, counted (issue 25: a handful)


def test_api_bench_drives_every_target() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "api.py"), "--seconds", "0.3", "--runs", "1", "--clients", "4",
         "--backends", "sqlite"],
        capture_output=True, text=True, timeout=300, check=True, cwd=ROOT,
    ).stdout
    for target in ("bare aiohttp", "POST /v1/quotes, one spec", "POST /v1/quotes, each spec new",
                   "POST /v1/jobs, SQLite"):
        line = next((x for x in out.splitlines() if x.startswith(target)), None)
        assert line is not None, out
        assert re.search(r"\{(200|201): \d+\}$", line), line  # every answer a success


def test_startup_bench_prints_each_command() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "startup.py"), "--runs", "1"],
                         capture_output=True, text=True, timeout=300, check=True, cwd=ROOT).stdout
    assert "lockstep --help" in out and "lockstep quote … --json" in out
