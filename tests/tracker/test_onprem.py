"""On-prem and reserved figures: utilisation from real Slurm answers, owned rates from the local cluster."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker.models import Locality, Market, Offer
from broker.price_summaries import market_summaries, percentile, rate_points, utilisation_points
from broker.store import Store
from broker.tracker import Tracker
from providers.slurm import SlurmProvider, api
from providers.slurm.config import SlurmConfig
from providers.slurm.offers import gpu_model, node_usage

AT = datetime(2026, 1, 5, tzinfo=UTC)


def test_utilisation_from_a_real_slurm_23_11_nodes_answer(shared_data: Path) -> None:
    data = json.loads((shared_data / "slurm/slurm-23.11-v0.0.40/V0040OpenapiNodesResp.json").read_text())
    nodes = [node_usage(n) for n in api.parse_nodes(data)]
    points = {p.gpu: p for p in utilisation_points("slurm", "hpc", nodes, AT)}
    # n0160: 1 of 1 A100 80GB PCIe allocated. n1000: 8 H100, none allocated (n0999 is drained: not counted).
    # The MIG slices (1g.10gb) are fractions of a GPU, not a model: left out.
    assert set(points) == {"A100-PCIe-80GB", "H100-SXM"}
    assert points["A100-PCIe-80GB"].usd_per_hour == 1.0 and points["A100-PCIe-80GB"].count == 1
    assert points["H100-SXM"].usd_per_hour == 0.0 and points["H100-SXM"].count == 8
    assert all(
        p.stat == "utilisation" and p.market == Market.owned and p.region == "hpc" for p in points.values()
    )


def test_percentile_matches_numpy() -> None:
    import numpy as np

    values = [0.31, 0.35, 0.4, 0.42, 0.5, 0.77, 1.2]
    for q in (0, 10, 50, 90, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def offer(market: Market, sku: str, gpus: int, price: float, **attrs: str) -> Offer:
    return Offer(
        id=f"{sku}-{gpus}-{price}",
        provider="p",
        market=market,
        sku=sku,
        gpu="H100-SXM",
        gpu_count=gpus,
        usd_per_hour=price,
        locality=Locality(provider="p", region="r", zone="z"),
        attrs=attrs,
    )


def test_owned_rate_is_the_whole_node_rate_whatever_part_is_free() -> None:
    offers = [
        offer(Market.owned, "h100x8", 2, 5.0, configured_gpus="8"),  # 2 free GPUs of an 8-GPU node
        offer(Market.owned, "h100x8", 8, 20.0, configured_gpus="8"),
        offer(Market.reserved, "p5.48xlarge", 8, 0.0),
        offer(Market.spot, "p5.48xlarge", 8, 30.0),
    ]  # a market price, not a rate
    points = rate_points("p", offers, AT)
    assert sorted((p.market.value, p.sku, p.usd_per_hour) for p in points) == [
        ("owned", "h100x8", 20.0),
        ("reserved", "p5.48xlarge", 0.0),
    ]
    # Summaries take only the market offers, per GPU: 30 / 8.
    mn, p10, med = market_summaries("p", offers, AT)
    assert (p10.stat, p10.usd_per_hour, med.stat, med.usd_per_hour) == ("p10", 3.75, "median", 3.75)
    assert (mn.stat, mn.usd_per_hour, mn.count, mn.sku) == ("min", 3.75, 1, "H100-SXM/gpu")


async def test_tracker_records_owned_rates_and_utilisation_of_the_local_cluster(
    lite_store: Store, slurm_config: SlurmConfig, clock
) -> None:
    from broker.config import Settings

    async with SlurmProvider(slurm_config) as slurm:
        nodes = await slurm.client.nodes()
        report = await Tracker(
            Settings(slurm=slurm_config), lite_store, {"slurm": slurm}, clock=clock
        ).run_once()
    assert report.errors == []
    util = lite_store.price_history(provider="slurm", stat="utilisation")
    totals: dict[str, int] = {}
    for n in nodes:
        model = gpu_model(n.gpu_type, n.features)
        if n.healthy and n.gpus_total > 0 and model:
            totals[model] = totals.get(model, 0) + n.gpus_total
    assert {p.gpu: p.count for p in util} == totals and totals
    assert all(0.0 <= p.usd_per_hour <= 1.0 and p.region == "onprem" for p in util)
    rates = lite_store.price_history(provider="slurm", stat="price")
    assert rates and all(p.market == Market.owned for p in rates)
    node_rate = slurm_config.owned.usd_per_node_hour()
    # Owned hardware costs its amortised node-hour: every rate is that node rate (per configured node).
    assert {round(p.usd_per_hour, 4) for p in rates} == {round(node_rate, 4)}
    assert report.sources["slurm"].stored == len(util) + len(rates)
