"""Search: constraints are pushed down in the API's own operators, and answers come back normalised."""

from __future__ import annotations

from broker.gpus import GPU_SPECS, normalise_gpu
from broker.market import Marketplace
from broker.models import Colocate, Fabric, Market
from providers.base import OfferQuery, matches
from providers.vast import VastProvider
from providers.vast.offers import HOURS_PER_MONTH, VAST_NAMES
from standins.vastapi.offers import DEFAULT_ANCHORS, MODELS, catalog_anchors


async def test_search_pushes_filters_down_and_returns_only_matching_offers(vast_api, vast_config):
    query = OfferQuery(gpus=["A100-SXM-80GB", "H100-SXM"], min_gpus_per_node=4, min_gpu_memory_gb=80,
                       max_usd_per_hour=12.0, markets=[Market.on_demand], regions=["US", "us-east-1"],
                       min_reliability=0.9, disk_gb=200)
    vast_config.verified_only = True
    async with VastProvider(vast_config) as vast:
        market = Marketplace({"vast": vast})
        await market.refresh(query)  # the adapter pushes down, the market filters its answer (matches())
        offers = market.offers()

    [sent] = vast_api.state.searches()
    assert sent["gpu_name"] == {"in": ["A100 SXM4", "H100 SXM"]}
    assert sent["num_gpus"] == {"gte": 4}
    assert sent["gpu_ram"] == {"gte": 80000.0}  # GB → MB, as the CLI sends it
    assert sent["dph_total"] == {"lte": 12.0}
    assert sent["reliability"] == {"gte": 0.9}
    assert sent["geolocation"] == {"in": ["US"]}  # AWS region names are not Vast's
    assert sent["disk_space"] == {"gte": 200}
    assert sent["allocated_storage"] == 200
    assert sent["type"] == "on-demand"
    assert sent["order"] == [["dph_total", "asc"]]
    for flag, value in (("verified", True), ("rentable", True), ("rented", False), ("external", False)):
        assert sent[flag] == {"eq": value}

    assert offers, "the seeded market has 80 GB A100s and H100s in the US under $12/h"
    market = {o["id"]: o for o in vast_api.state.offers.values()}
    for o in offers:
        raw = market[int(o.attrs["ask_id"])]
        assert o.gpu in ("A100-SXM-80GB", "H100-SXM")
        assert o.gpu_count >= 4 and o.gpu_memory_gb >= 80
        assert o.usd_per_hour <= 12.0 and o.reliability >= 0.9
        assert o.market is Market.on_demand and not o.interruptible
        assert o.region == "US" and raw["verified"] and raw["disk_space"] >= 200
        storage = raw["storage_cost"] * 200 / HOURS_PER_MONTH
        assert abs(o.usd_per_hour - (raw["dph_base"] + storage)) < 1e-6
    prices = [o.usd_per_hour for o in offers]
    assert prices == sorted(prices)  # the API's order


async def test_offers_are_single_machines_normalised_from_vast_fields(vast_api, vast_config):
    async with VastProvider(vast_config) as vast:
        offers = await vast.offers(OfferQuery(gpus=["RTX-4090"], disk_gb=100))
    assert len(offers) > 20
    market = {o["id"]: o for o in vast_api.state.offers.values()}
    spot = [o for o in offers if o.market is Market.spot]
    assert spot and len(spot) < len(offers)
    for o in offers:
        raw = market[int(o.attrs["ask_id"])]
        assert o.provider == "vast" and o.gpu == "RTX-4090" and o.sku == f"{raw['num_gpus']}x-RTX-4090"
        assert o.max_nodes == 1 and o.colocation is Colocate.node
        assert o.network.fabric is Fabric.ethernet
        assert o.network.fabric_gbps == round(min(raw["inet_up"], raw["inet_down"]) / 1000, 3)
        assert o.network.inet_down_mbps == raw["inet_down"] and o.network.inet_up_mbps == raw["inet_up"]
        assert o.locality.host == str(raw["machine_id"])
        assert o.locality.region == raw["geolocation"].rsplit(", ", 1)[1]
        assert o.attrs["pcie_bw"] == str(raw["pcie_bw"]) and o.attrs["disk_bw"] == str(raw["disk_bw"])
        assert o.perf is not None and o.perf.source == "dlperf" and 0.7 <= o.perf.relative <= 1.1
        assert o.reliability == raw["reliability"]
        storage = raw["storage_cost"] * 100 / HOURS_PER_MONTH
        if o.market is Market.spot:
            assert o.interruptible and o.id == f"vast:{raw['id']}:spot"
            assert abs(o.usd_per_hour - (raw["min_bid"] + storage)) < 1e-6
        else:
            assert o.id == f"vast:{raw['id']}"
            assert abs(o.usd_per_hour - (raw["dph_base"] + storage)) < 1e-6


async def test_spot_only_searches_bids_and_caps_min_bid(vast_api, vast_config):
    query = OfferQuery(gpus=["RTX-3090"], markets=[Market.spot], max_usd_per_hour=0.5)
    async with VastProvider(vast_config) as vast:
        answer = await vast.offers(query)
    [sent] = vast_api.state.searches()
    assert sent["type"] == "bid" and sent["min_bid"] == {"lte": 0.5} and "dph_total" not in sent
    assert answer and all(o.market is Market.spot for o in answer)
    offers = [o for o in answer if matches(o, query)]  # what the market keeps
    assert offers and all(o.usd_per_hour <= 0.5 for o in offers)


async def test_a100_memory_variants_share_a_name_and_are_told_apart(vast_api, vast_config):
    query = OfferQuery(gpus=["A100-PCIe-40GB"], markets=[Market.on_demand])
    async with VastProvider(vast_config) as vast:
        answer = await vast.offers(query)  # Vast's name "A100 PCIE" covers both sizes: the search gets both
        market = Marketplace({"vast": vast})
        await market.refresh(query)
    for o in answer:  # each told apart by its memory
        assert (o.gpu, o.gpu_memory_gb < 50) in (("A100-PCIe-40GB", True), ("A100-PCIe-80GB", False))
    forty = market.offers()  # the market keeps what the query asked for
    assert forty and {o.gpu for o in forty} == {"A100-PCIe-40GB"}
    assert all(o.gpu_memory_gb < 50 for o in forty)


def test_vast_spellings_normalise_back_to_their_model():
    for model, names in VAST_NAMES.items():
        for name in names:
            assert normalise_gpu(name, GPU_SPECS[model].memory_gb) == model, name
    for m in MODELS:
        assert normalise_gpu(m.vast_name, m.ram_mb / 1000) is not None, m.vast_name


def test_price_anchors_are_the_catalog_medians(shared_data):
    medians = catalog_anchors(shared_data / "catalogs" / "vast_vms_v7.csv")
    for token, price in DEFAULT_ANCHORS.items():
        assert abs(medians[token] - price) < 0.005, token


async def test_numbers_sent_as_strings_read_the_same(vast_api, vast_config):
    query = OfferQuery(gpus=["L40S", "H100-PCIe"], disk_gb=80)
    async with VastProvider(vast_config) as vast:
        plain = await vast.offers(query)
        vast_api.state.faults.numbers_as_strings = True
        stringy = await vast.offers(query)
    assert plain
    strip = {"observed_at"}
    assert [o.model_dump(exclude=strip) for o in stringy] == [o.model_dump(exclude=strip) for o in plain]
