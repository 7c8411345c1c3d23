"""The bundled price catalog: the shipped file, its offers, and that it matches the real data."""

from __future__ import annotations

import csv
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from broker.market import Marketplace
from broker.models import Colocate, Fabric, IntraNode, Market, Offer, OfferSource
from providers.base import OfferQuery
from providers.capabilities import Launches, Snapshot
from providers.catalog import CatalogProvider
from providers.catalog.client import (
    aws_instance_info,
    aws_on_demand_price,
    aws_spot_price,
    load_catalog,
    vast_typical_price,
)
from providers.catalog.offers import catalog_offers

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "compile_catalog.py"
SHIPPED = ROOT / "providers" / "data" / "catalog.json"


@pytest.fixture(scope="module")
def offers() -> tuple[Offer, ...]:
    return catalog_offers()


def test_file_loads_with_header() -> None:
    cat = load_catalog()
    assert cat["compiled"] == "2026-11-29"
    assert {s["id"] for s in cat["sources"]} >= {"skypilot-aws-v7", "skypilot-vast-v7", "moto-ec2"}
    assert load_catalog() is cat  # cached: parsed once
    assert load_catalog(str(SHIPPED)) == cat  # an explicit path reads the same file


def test_p5_is_8_h100_sxm_with_efa_3200() -> None:
    info = aws_instance_info("p5.48xlarge")
    assert info is not None
    assert (info["gpu"], info["gpus"], info["gpu_memory_gb"]) == ("H100-SXM", 8, 80.0)
    assert info["efa"] is True and info["network_gbps"] == 3200.0 and info["nvlink"] is True
    assert (info["vcpus"], info["ram_gb"]) == (192, 2048.0)


def test_instance_facts() -> None:
    p4d = aws_instance_info("p4d.24xlarge")
    assert p4d and p4d["gpu"] == "A100-SXM-40GB" and p4d["network_gbps"] == 400.0  # "4x 100 Gigabit"
    p4de = aws_instance_info("p4de.24xlarge")
    assert p4de and p4de["gpu"] == "A100-SXM-80GB"
    g5 = aws_instance_info("g5.xlarge")
    assert g5 and g5["gpu"] == "A10G" and not g5["efa"] and not g5["nvlink"]
    assert g5["network_gbps"] == 10.0 and g5["network_baseline_gbps"] < g5["network_gbps"]  # "Up to 10"
    assert aws_instance_info("p5en.48xlarge")["gpu"] == "H200"  # type: ignore[index]
    assert aws_instance_info("no.such") is None


def test_every_offer_validates_and_ids_are_unique(offers: tuple[Offer, ...]) -> None:
    assert len(offers) > 100
    ids = [o.id for o in offers]
    assert len(ids) == len(set(ids))
    for o in offers:
        again = Offer.model_validate(o.model_dump(mode="json"))
        assert again == o
        assert o.attrs["source"] == "catalog" and o.source is OfferSource.snapshot
        assert o.usd_per_hour > 0 and o.gpu_count > 0
        assert o.observed_at.date().isoformat() == "2026-11-29"
        assert o.provider in ("aws", "vast")


def test_aws_offer_shapes(offers: tuple[Offer, ...]) -> None:
    by_id = {o.id: o for o in offers}
    p5 = by_id["catalog:aws:p5.48xlarge:us-east-1:on_demand"]
    assert p5.market is Market.on_demand and p5.zone == "" and p5.region == "us-east-1"
    assert p5.usd_per_hour == 98.32 and p5.egress_usd_per_gb == 0.09
    assert p5.network.fabric is Fabric.efa and p5.network.fabric_gbps == 3200.0
    assert p5.network.intra is IntraNode.nvlink
    assert p5.colocation is Colocate.cluster and p5.max_nodes == 16
    spot = by_id["catalog:aws:p5.48xlarge:use1-az4:spot"]
    assert spot.interruptible and spot.market is Market.spot and spot.region == "us-east-1"
    assert spot.zone == "use1-az4"
    g5 = by_id["catalog:aws:g5.xlarge:us-west-2:on_demand"]
    assert g5.network.fabric is Fabric.ethernet and g5.colocation is Colocate.cluster
    assert g5.network.fabric_gbps == 2.5  # sustained baseline, not the "up to" burst
    for sku in ("g5.12xlarge", "g6.xlarge", "g6e.48xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5en.48xlarge"):
        for region in ("us-east-1", "us-west-2"):
            assert aws_on_demand_price(sku, region), (sku, region)


def test_vast_offers_are_single_machines(offers: tuple[Offer, ...]) -> None:
    vast = [o for o in offers if o.provider == "vast"]
    assert vast
    for o in vast:
        assert o.max_nodes == 1 and o.colocation is Colocate.node and o.market is Market.on_demand
        assert o.network.fabric is Fabric.ethernet and o.egress_usd_per_gb == 0.0
    h100 = {o.gpu_count: o for o in vast if o.gpu == "H100-SXM"}
    assert h100[8].network.intra is IntraNode.nvlink


async def test_provider_is_read_only_and_cached() -> None:
    prov = CatalogProvider()
    assert prov.name == "catalog" and isinstance(prov, Snapshot) and not isinstance(prov, Launches)
    assert prov.as_of.date().isoformat() == "2026-11-29"
    first, second = await prov.offers(), await prov.offers()
    assert first == second and all(a is b for a, b in zip(first, second, strict=True))
    assert len(await CatalogProvider(max_cluster_nodes=4).offers()) == len(first)
    four = await CatalogProvider(max_cluster_nodes=4).offers()
    assert {o.max_nodes for o in four if o.provider == "aws"} == {4}
    with pytest.raises(ValueError):
        CatalogProvider(max_cluster_nodes=0)
    assert not hasattr(prov, "launch")  # nothing to buy: the router never launches a snapshot row


async def test_a_query_through_the_market_never_drops_a_match() -> None:
    prov = CatalogProvider()
    everything = await prov.offers()
    q = OfferQuery(gpus=["H100-SXM"], markets=[Market.spot], regions=["us-east-1"], min_gpus_per_node=8)
    market = Marketplace({"catalog": prov})
    await market.refresh(q)
    got = market.offers()
    assert got and all(o.gpu == "H100-SXM" and o.market is Market.spot for o in got)
    expected = [o for o in everything if o.gpu == "H100-SXM" and o.market is Market.spot
                and o.gpu_count >= 8 and o.region in ("us-east-1", "")]
    assert got == expected
    await market.refresh(OfferQuery(max_usd_per_hour=0.01))
    assert market.offers() == []


# --------------------------------------------------------------------------- against the real data


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_aws_prices_match_skypilot(shared_data: Path) -> None:
    rows = _rows(shared_data / "catalogs" / "aws_vms_v7_p-family_excerpt.csv")
    checked = 0
    for row in rows:
        if row["InstanceType"] in ("p5.48xlarge", "p4d.24xlarge", "p5en.48xlarge") and row["Price"]:
            got = aws_on_demand_price(row["InstanceType"], row["Region"])
            assert got == pytest.approx(float(row["Price"]))
            checked += 1
    assert checked > 20
    # p5e has no on-demand price in the data: none invented.
    assert aws_on_demand_price("p5e.48xlarge", "us-west-2") is None
    spot = [r for r in rows if r["InstanceType"] == "p5.48xlarge" and r["AvailabilityZone"] == "use1-az3"]
    assert aws_spot_price("p5.48xlarge", "use1-az3") == pytest.approx(float(spot[0]["SpotPrice"]))


def test_spot_medians_match_price_history(shared_data: Path) -> None:
    prices: list[float] = []
    with (shared_data / "spot" / "aws-spot-prices-2022-05-31-gpu.tsv").open() as fh:
        for az, sku, product, price, _ts in csv.reader(fh, delimiter="\t"):
            if (az, sku, product) == ("use1-az1", "g5.48xlarge", "Linux/UNIX"):
                prices.append(float(price))
    assert len(prices) >= 2, "the history has several g5.48xlarge prices in use1-az1"
    assert aws_spot_price("g5.48xlarge", "use1-az1") == pytest.approx(statistics.median(prices))
    # A Linux spot price, below on-demand here (RHEL/SUSE/Windows rows are left out).
    assert aws_spot_price("g5.48xlarge", "use1-az1") < aws_on_demand_price("g5.48xlarge", "us-east-1")


def test_list_prices_from_the_brief() -> None:
    assert aws_on_demand_price("g5.xlarge", "us-east-1") == 1.006
    assert aws_on_demand_price("g5.48xlarge", "us-west-2") == 16.288
    assert aws_on_demand_price("g6.xlarge", "us-east-1") == 0.8048
    assert aws_on_demand_price("g6e.48xlarge", "us-east-1") == pytest.approx(30.131, abs=1e-3)
    assert aws_on_demand_price("g5.xlarge", "mars-1") is None


def test_vast_prices_match_data(shared_data: Path) -> None:
    rows = _rows(shared_data / "catalogs" / "vast_vms_v7.csv")
    h100x8 = [float(r["Price"]) for r in rows if r["InstanceType"].startswith("8x-H100_SXM-")]
    assert vast_typical_price("H100-SXM", 8) == pytest.approx(statistics.median(h100x8))
    per_gpu_4090 = [float(r["Price"]) / int(r["AcceleratorCount"]) for r in rows
                    if r["InstanceType"].startswith("1x-RTX_4090-")]
    assert vast_typical_price("RTX 4090") == pytest.approx(statistics.median(per_gpu_4090))
    assert vast_typical_price("H200", 3) is not None  # count not seen: per-GPU median × 3
    assert vast_typical_price("K80") is None


# --------------------------------------------------------------------------- the compile script


def _compile(shared_data: Path, out: Path) -> str:
    # PYTHONPATH: the script imports this checkout's code, not an installed copy of another one.
    subprocess.run([sys.executable, str(SCRIPT), "--data", str(shared_data), "--out", str(out)],
                   check=True, capture_output=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return out.read_text()


def test_compile_is_deterministic_and_shipped_file_is_current(shared_data: Path, tmp_path: Path) -> None:
    first = _compile(shared_data, tmp_path / "a.json")
    second = _compile(shared_data, tmp_path / "b.json")
    assert first == second
    assert first == SHIPPED.read_text(), "providers/data/catalog.json is stale: run compile_catalog.py"
