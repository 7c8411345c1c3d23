"""`lockstep gpus` / GET /v1/gpus (issue 17 item 6): per GPU model, where it is offered, how much, at
what price range per market — the pure summary, the CLI and the API on both store backends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from broker.models import GpuSummary, Locality, Market, Offer
from policies.book import OfferBook
from policies.offers import gpu_summary
from tests.spec.conftest import ROOT, Server, run_cli, strict_json


def offer(oid: str, gpu: str, market: Market, price: float, count: int, region: str, provider: str = "p",
          host: str = "") -> Offer:
    return Offer(id=oid, provider=provider, market=market, sku="s", gpu=gpu, gpu_count=count, usd_per_hour=price,
                 locality=Locality(provider=provider, region=region, host=host))


def test_summary_per_model_and_market() -> None:
    offers = [
        offer("a", "H100-SXM", Market.on_demand, 80.0, 8, "us-east-1", "aws"),
        offer("b", "H100-SXM", Market.on_demand, 16.0, 1, "EU", "vast"),
        offer("c", "H100-SXM", Market.spot, 24.0, 8, "us-west-2", "aws"),
        offer("d", "MI300X", Market.reserved, 20.0, 8, "", "neo"),
        offer("e", "Z80", Market.owned, 1.0, 2, "lab", "slurm", host="sick"),
        offer("f", "Z80", Market.owned, 3.0, 2, "lab", "slurm"),
    ]
    book = OfferBook.build(offers).with_health({("slurm", "sick"): "ECC"})
    rows = {r.gpu: r for r in gpu_summary(book)}
    assert list(rows) == ["H100-SXM", "MI300X", "Z80"]  # the table's order, unknown models last
    h100 = rows["H100-SXM"]
    assert (h100.vendor, h100.memory_gb, h100.offers, h100.gpus) == ("nvidia", 80, 3, 17)
    assert h100.regions == ["EU", "us-east-1", "us-west-2"]
    spot, on_demand = h100.markets
    assert (spot.market, spot.offers, spot.min_usd_per_gpu_hour, spot.max_usd_per_gpu_hour) == (
        Market.spot, 1, 3.0, 3.0)
    assert (on_demand.offers, on_demand.gpus, on_demand.min_usd_per_gpu_hour, on_demand.max_usd_per_gpu_hour,
            on_demand.providers) == (2, 9, 10.0, 16.0, ["aws", "vast"])
    assert rows["MI300X"].vendor == "amd" and rows["MI300X"].regions == []
    z80 = rows["Z80"]  # the unhealthy node is left out
    assert (z80.vendor, z80.offers, z80.markets[0].min_usd_per_gpu_hour) == ("", 1, 1.5)
    assert [r.gpu for r in gpu_summary(book, ["H100"])] == ["H100-SXM"]
    assert gpu_summary(OfferBook.build([])) == []


def test_cli_gpus_json_table_and_filter(clean_env: None, tmp_path: Path) -> None:
    r = run_cli("--db", f"{tmp_path}/g.db", "gpus", "--json")
    assert r.code == 0, r.err
    rows = [GpuSummary.model_validate(x) for x in strict_json(r.out)]
    h100 = next(x for x in rows if x.gpu == "H100-SXM")
    assert {m.market for m in h100.markets} >= {Market.spot, Market.on_demand} and h100.gpus > 0
    assert all(m.min_usd_per_gpu_hour <= m.max_usd_per_gpu_hour for x in rows for m in x.markets)
    only = run_cli("--db", f"{tmp_path}/g.db", "gpus", "--gpu", "A100", "--json")
    assert only.code == 0 and {x["gpu"] for x in strict_json(only.out)} <= {
        "A100-SXM-80GB", "A100-SXM-40GB", "A100-PCIe-80GB", "A100-PCIe-40GB"}
    table = run_cli("--db", f"{tmp_path}/g.db", "gpus")
    assert table.code == 0 and "H100-SXM" in table.out and "$/GPU-h" in table.out
    bad = run_cli("--db", f"{tmp_path}/g.db", "gpus", "--gpu", "!!")
    assert bad.code == 2 and bad.err.count("\n") == 1 and "gpu: " in bad.err


def test_api_gpus_on_both_backends(server: Server) -> None:
    with server.client() as c:
        r = c.get("/v1/gpus")
        assert r.status_code == 200, r.text
        rows = [GpuSummary.model_validate(x) for x in strict_json(r.text)]
        assert any(x.gpu == "H100-SXM" for x in rows)
        doc = c.get("/openapi.json").json()
        assert "get" in doc["paths"]["/v1/gpus"]  # the route table drives the document too
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        assert anonymous.get("/v1/gpus").status_code == 401


def test_remote_cli_prints_what_the_server_answers(sqlite_server: Server) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["LOCKSTEP_TOKEN"] = sqlite_server.token
    r = subprocess.run([sys.executable, "-m", "broker", "--server", sqlite_server.url, "gpus", "--json"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    with sqlite_server.client() as c:
        assert strict_json(r.stdout) == c.get("/v1/gpus").json()
