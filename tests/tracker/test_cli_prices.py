"""The real `lockstep prices` commands, as a user runs them, against a local store and Vast server."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from broker.cli import main
from standins.vastapi.server import VastApiServer
from tests.conftest import ROOT
from tests.plugins.vast import VAST_TEST_KEY
from tests.tracker.test_tracker_vast import scale

TSV = "spot/aws-spot-prices-2022-05-31-gpu.tsv"


async def lockstep(*args: str, db: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run `python -m broker …` without blocking the event loop (the Vast server shares it)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKSTEP_", "AWS_"))}
    base.update({"LOCKSTEP_DB": f"sqlite:///{db}", "LOCKSTEP_CATALOG__ENABLED": "false", "NO_COLOR": "1"})
    base.update(env or {})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "broker",
        *args,
        cwd=ROOT,
        env=base,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def run_main(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, db: Path, *args: str
) -> tuple[int, str, str]:
    """The CLI entry point in-process (no server involved): exit code, stdout, stderr."""
    monkeypatch.setenv("LOCKSTEP_DB", f"sqlite:///{db}")
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_replay_of_the_real_records(shared_data: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    db = tmp_path / "l.db"
    rc, out, err = run_main(capsys, monkeypatch, db, "prices", "replay", str(shared_data / TSV))
    assert rc == 0, err
    assert "1594 records, 1572 series" in out and "no spikes flagged" in out
    rc, out, err = run_main(
        capsys,
        monkeypatch,
        db,
        "prices",
        "replay",
        str(shared_data / TSV),
        "--multiple",
        "1.01",
        "--clear",
        "1.005",
        "--json",
    )
    assert rc == 0, err
    assert [(s["series"]["zone"], s["series"]["sku"], s["peak"]) for s in json.loads(out)] == [
        ("cac1-az1", "g4ad.4xlarge", 1.6885)
    ]


def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    db = tmp_path / "l.db"
    rc, _, err = run_main(
        capsys, monkeypatch, db, "prices", "history", "--gpu", "H100", "--since", "last tuesday"
    )
    assert rc == 2 and err.strip().count("\n") == 0 and err.startswith("lockstep: since:")
    rc, _, err = run_main(capsys, monkeypatch, db, "prices", "replay", str(tmp_path / "absent.json"))
    assert rc == 2 and "absent.json" in err and "Traceback" not in err
    bad = tmp_path / "bad.tsv"
    bad.write_text("use1-az1\tp5.48xlarge\n")
    rc, _, err = run_main(capsys, monkeypatch, db, "prices", "replay", str(bad))
    assert rc == 2 and "expected 5 tab-separated fields" in err
    rc, _, err = run_main(capsys, monkeypatch, db, "prices", "replay", str(bad), "--multiple", "0.9")
    assert rc == 2 and err.startswith("lockstep: multiple:")


async def test_track_once_then_history_chart_and_alerts(tmp_path: Path, vast_api: VastApiServer) -> None:
    db = tmp_path / "l.db"
    env = {
        "LOCKSTEP_VAST_URL": vast_api.url,
        "LOCKSTEP_VAST_API_KEY": VAST_TEST_KEY,
        "LOCKSTEP_VAST__SEARCH_LIMIT": "1000",
        "LOCKSTEP_VAST__VERIFIED_ONLY": "false",
        "LOCKSTEP_VAST__MIN_RELIABILITY": "0",
    }
    rc, out, err = await lockstep("prices", "track", "--once", "--json", db=db, env=env)
    assert rc == 0, err
    report = json.loads(out)
    assert report["leader"] is True and report["sources"]["vast"]["stored"] == report["stored"] > 0
    assert VAST_TEST_KEY not in out + err

    scale(vast_api, "RTX-4090", 3.0)
    rc, out, err = await lockstep("prices", "track", "--once", db=db, env=env)
    assert rc == 0, err
    assert "spikes opened 2" in out

    rc, out, err = await lockstep("prices", "alerts", "--open", "--json", db=db)
    assert rc == 0, err
    alerts = json.loads(out)
    assert sorted(a["series"]["market"] for a in alerts) == ["on_demand", "spot"]
    assert all(a["series"]["gpu"] == "RTX-4090" and a["end"] is None and a["ratio"] > 2.9 for a in alerts)

    png = tmp_path / "h.png"
    rc, out, err = await lockstep(
        "prices", "history", "--gpu", "RTX-4090", "--since", "1d", "--png", str(png), db=db
    )
    assert rc == 0, err
    assert "vast on_demand RTX-4090/gpu [median]" in out and "chart written to" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    rc, out, err = await lockstep("prices", "history", "--gpu", "RTX-4090", "--since", "1d", "--json", db=db)
    points = json.loads(out)
    assert rc == 0 and {p["stat"] for p in points} == {"median"} and len(points) == 4  # 2 markets × 2 runs


def test_history_shows_the_spikes_the_tracker_flags(tmp_path: Path, capsys, monkeypatch) -> None:
    """One spike rule: a spot series that triples is flagged; the same jump in a reserved rate (configuration,
    not a market) is not, in the chart's table as in the tracker's alerts."""
    from datetime import timedelta

    from broker import tracker
    from broker.models import Market, PricePoint, utcnow
    from broker.store import open_store
    from policies import spikes

    assert (tracker.SPIKE_MARKETS, tracker.SPIKE_STATS) == (spikes.SPIKE_MARKETS, spikes.SPIKE_STATS)
    db = tmp_path / "l.db"
    now = utcnow()
    points = [
        PricePoint(provider="aws", market=market, sku="p5.48xlarge", gpu="H100-SXM", region="us-east-1",
                   zone="us-east-1a", usd_per_hour=price, at=now - timedelta(hours=10 - i))
        for market in (Market.spot, Market.reserved)
        for i, price in enumerate([10.0, 10.5, 10.0, 10.2, 30.0, 31.0, 10.0])
    ]
    with open_store(f"sqlite:///{db}") as store:
        store.add_price_points(points)
    monkeypatch.setenv("NO_COLOR", "1")
    rc, out, err = run_main(capsys, monkeypatch, db, "prices", "history", "--gpu", "H100", "--since", "1d")
    assert rc == 0, err
    rows = {cells[0]: cells[-1] for line in out.splitlines() if line.startswith("│ aws ")
            for cells in [[c.strip() for c in line.strip()[1:-1].split("│")]]}
    assert rows == {"aws reserved p5.48xlarge us-east-1a": "", "aws spot p5.48xlarge us-east-1a": "1"}
