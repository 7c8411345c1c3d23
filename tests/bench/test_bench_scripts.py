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
    assert re.search(r"7-day history for 'H100-SXM': [\d,]+ points in \d+ series", out)
    assert len(re.findall(r"as PriceSeries \(columns\): median [\d.]+ ms", out)) == 2
    assert len(re.findall(r"as PricePoint per point:  median [\d.]+ ms", out)) == 2
