"""A first `prices track --once` with no live market, and the history it leaves (issue 29): the run says which
markets it did not poll and why, and `prices history --png` draws no empty chart."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tracker.test_cli_prices import lockstep


async def test_a_run_with_no_live_market_says_why_each_was_not_polled(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    catalog_on = {"LOCKSTEP_CATALOG__ENABLED": "true"}
    rc, out, err = await lockstep("prices", "track", "--once", db=db, env=catalog_on)
    assert rc == 0, err
    assert "no live market to poll, nothing stored" in out
    assert "not polled: vast: not switched on: needs vast.enabled: true and vast.api_key" in out
    assert "not polled: aws: not switched on: needs aws.enabled: true" in out
    assert "not polled: slurm: not switched on: needs slurm.enabled: true and slurm.url" in out
    assert "not polled: catalog: a bundled price snapshot, not a live market" in out
    assert "┏" not in out  # no empty table

    rc, out, err = await lockstep("prices", "track", "--once", "--json", db=db, env=catalog_on)
    assert rc == 0, err
    report = json.loads(out)
    assert report["sources"] == {} and report["stored"] == 0
    assert set(report["skipped"]) == {"catalog", "slurm", "aws", "reserved", "vast"}
    assert report["skipped"]["reserved"].startswith("not switched on: needs aws.enabled: true and aws.capacity")


async def test_history_with_no_points_writes_no_chart(tmp_path: Path) -> None:
    db, png = tmp_path / "h.db", tmp_path / "h.png"
    rc, out, err = await lockstep("prices", "history", "--gpu", "H100", "--png", str(png), db=db)
    assert rc == 0, err
    assert not png.exists()
    assert "no price points since" in out and f"so no chart written to {png}" in out
    assert "chart written to" not in out.replace(f"no chart written to {png}", "")
