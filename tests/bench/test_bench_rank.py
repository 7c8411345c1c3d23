"""bench/rank.py still runs and prints each figure beside its same-run reference (tiny sizes; no timings
asserted: speed is measured by the script, not by tests)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rank_bench_prints_figures_beside_references() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "rank.py"), "--offers", "3000", "--mid", "0", "--big", "30000",
         "--jobs", "40", "--runs", "2", "--repeat", "4"],
        capture_output=True, text=True, timeout=600, check=True, cwd=ROOT,
    ).stdout
    assert "offers in book:              3,000" in out
    from broker.api.params import QuoteParams

    default = QuoteParams.model_fields["max_rejected"].default
    assert f"rejections written out:      {default} per quote (the API's default)" in out
    figure = r"min [\d.]+ / median [\d.]+ ms"
    assert re.search(rf"quote 8 × H100 \(top 10\):\s+{figure}", out)
    assert re.search(rf"numpy floor, same job:\s+{figure}\s+quote / floor = [\d.]+×", out)
    assert re.search(rf"`gpu: any` ≥ 24 GB, 1 GPU: {figure}", out)
    assert re.search(r"gpuhunt Catalog.query:\s+(min|not measured)", out)
    assert re.search(r"30,000 offers from columns \(no Offer objects; built in [\d.]+ s\), \d+ bytes per offer", out)
    assert re.search(r"folded by shape into [\d,]+ classes in [\d.]+ s", out)
    assert re.search(rf"the plain pass, no pruning: {figure}\s+plain / pruned = [\d.]+×", out)
    assert re.search(r"load average [\d.]+ / [\d.]+ / [\d.]+ \(1 / 5 / 15 min\) at the end", out)
    assert "200,000 offers" not in out  # --mid 0 skips the middle book
    per_offer = int(re.search(r"(\d+) bytes per offer", out).group(1))  # type: ignore[union-attr]
    assert 0 < per_offer <= 1024
