"""The indexed, columnar book gives the answers a plain per-offer check gives, and holds no Offer per row.

The reference below is written from the constraint table's words, offer by offer, in plain Python
(no numpy, no index): the screen over the book's groups and rows must give every offer the same code.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from broker.errors import SpecError
from broker.gpus import GPU_SPECS, Runtime, fold
from broker.models import (
    COLOCATE_RANK,
    Colocate,
    Fabric,
    FabricNeed,
    IntraNode,
    JobSpec,
    Locality,
    Market,
    Network,
    Offer,
)
from broker.specs import parse_spec
from policies.book import OfferBook, offer_columns
from policies.constraints import CHECKS, CODE_OF, memory_needed, reject_codes
from policies.ranking import quote
from providers.catalog.offers import catalog_offers

NOW = datetime(2026, 12, 1, tzinfo=UTC)
GPUS = ["H100-SXM", "H100-PCIe", "A100-SXM-80GB", "L40S", "RTX-4090", "MI300X", "B300", "T4", "Z80"]


def make_offers(n: int, seed: int) -> list[Offer]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        gpu = rng.choice(GPUS)
        market = rng.choice(list(Market))
        provider = rng.choice(["aws", "vast", "slurm", "neo", "reserved"])
        out.append(Offer(
            id=f"o{i}", provider=provider, market=market, sku=f"sku{rng.randint(1, 9)}", gpu=gpu,
            gpu_count=rng.choice([1, 2, 4, 8]), gpu_memory_gb=rng.choice([0, 24, 48, 80, 192]),
            usd_per_hour=round(rng.uniform(0.1, 120), 2), divisible=market is Market.owned,
            interruptible=market is Market.spot, max_nodes=rng.choice([1, 2, 8, 64]),
            colocation=rng.choice(list(Colocate)),
            locality=Locality(provider=provider, region=rng.choice(["us-east-1", "us-west-2", "EU", ""]),
                              zone=rng.choice(["a", "b", ""]), host=rng.choice(["", f"h{i}"])),
            network=Network(intra=rng.choice(list(IntraNode)), fabric=rng.choice(list(Fabric)),
                            fabric_gbps=rng.choice([0, 10, 100, 400, 3200])),
            reliability=rng.choice([None, 0.5, 0.99]), egress_usd_per_gb=rng.choice([0.0, 0.05]),
            queue_wait_hours=rng.choice([0, 0, 5]),
            attrs={"containers": "none"} if provider == "slurm" and i % 2 else {},  # host-only pools
        ))
    return out


def random_spec(rng: random.Random, i: int) -> JobSpec:
    gpn = rng.choice([1, 2, 8])
    nodes = rng.choice([1, 1, 2, 8]) if gpn == 8 else 1
    data: dict[str, Any] = {
        "name": f"s{i}", "gpus": gpn * nodes, "gpus_per_node": gpn,
        "gpu": rng.choice([["H100"], ["A100", "L40S"], "any", ["MI300X", "H100"], ["Z80"], ["B300"], "T4"]),
        "markets": rng.sample(["spot", "on_demand", "reserved", "owned"], rng.randint(1, 4)),
        "interruptible": rng.random() < 0.5, "fabric": rng.choice(["any", "rdma", "ethernet", "infiniband"]),
        "colocate": rng.choice(["node", "cluster", "any", "region"]),
        "workload": rng.choice([{"hours": 3}, {"params_b": 70, "tokens_b": 1}, {"reference_gpu_hours": 50}]),
        "runtime": rng.choice(["cuda", "rocm", "any"]),
        "image": rng.choice(["python:3.12", "rocm/pytorch:latest", "nvcr.io/nvidia/pytorch:24.05-py3"]),
    }
    data["runtime"] = {"python:3.12": data["runtime"], "rocm/pytorch:latest": "rocm"}.get(data["image"], "cuda")
    if rng.random() < 0.3:
        data["providers"] = rng.sample(["aws", "vast", "slurm", "neo"], 2)
    if rng.random() < 0.2:
        data["onprem_only"] = True
    if rng.random() < 0.3:
        data["regions"] = ["us-east-1", "EU"]
    if rng.random() < 0.3:
        data["min_gpu_memory_gb"] = rng.choice([24, 80])
    if rng.random() < 0.3:
        data["min_fabric_gbps"] = 400
    if rng.random() < 0.3:
        data["min_reliability"] = 0.9
    if rng.random() < 0.3:
        data["max_usd_per_hour"] = rng.choice([5, 50])
    if i % 4 == 0:  # no image: runs on a host-only pool too
        del data["image"]
    try:
        return parse_spec(data)
    except SpecError as exc:  # e.g. only AMD models with a CUDA image: run it with a vendor-neutral image
        assert exc.field == "runtime", exc
        return parse_spec({**data, "runtime": "any", "image": "python:3.12"})


def reference_code(o: Offer, s: JobSpec, unhealthy: set[tuple[str, str]]) -> str | None:
    """The first constraint ``o`` breaks, from the check table's words, in plain Python."""
    assert s.gpus_per_node is not None
    spec_gpu = GPU_SPECS.get(o.gpu)
    memory = o.gpu_memory_gb or (spec_gpu.memory_gb if spec_gpu else 0.0)
    price = o.usd_per_hour / max(o.gpu_count, 1) * s.gpus_per_node if o.divisible else o.usd_per_hour
    stay = s.onprem_only or not s.cloud_ok
    checks = [
        ("provider", bool(s.providers and o.provider not in s.providers) or (stay and o.market is not Market.owned)),
        ("market", o.market not in s.markets),
        ("region", bool(s.regions) and o.region not in (s.regions or [])),
        ("unhealthy", (o.provider, o.locality.host) in unhealthy),
        ("gpu_model", bool(s.gpu) and fold(o.gpu) not in {fold(g) for g in s.gpu}),
        ("runtime", s.runtime in (Runtime.cuda, Runtime.rocm) and spec_gpu is not None
         and spec_gpu.runtime is not s.runtime),
        ("image", s.image is not None and o.attrs.get("containers") == "none"),
        ("gpu_memory", memory + 1e-9 < memory_needed(s)),
        ("gpus_per_node", o.gpu_count < s.gpus_per_node),
        ("nodes", s.nodes > 1 and o.max_nodes < s.nodes),
        ("colocation", s.nodes > 1 and COLOCATE_RANK[o.colocation] > COLOCATE_RANK[s.colocate]),
        ("fabric", s.fabric is not FabricNeed.any and not s.fabric.accepts(o.network.fabric)),
        ("fabric_bandwidth", bool(s.min_fabric_gbps) and (s.nodes > 1 or s.fabric is not FabricNeed.any)
         and o.network.fabric_gbps + 1e-9 < s.min_fabric_gbps),
        ("reliability", bool(s.min_reliability) and o.reliability is not None and o.reliability < s.min_reliability),
        ("interruptible", not s.interruptible and o.interruptible),
        ("price_cap", s.max_usd_per_hour is not None and price * s.nodes > s.max_usd_per_hour + 1e-9),
    ]
    return next((code for code, broken in checks if broken), None)


@pytest.fixture(scope="module")
def offers() -> list[Offer]:
    return make_offers(1200, seed=11)


def test_screen_matches_the_plain_reference_for_every_offer(offers: list[Offer]) -> None:
    unhealthy = {(o.provider, o.locality.host) for o in offers[::97] if o.locality.host}
    book = OfferBook.build(offers, unhealthy_hosts={k: "ECC" for k in unhealthy})
    # One index group per distinct (gpu, market, provider, region): what a query selects whole groups by.
    assert len(book.groups) == len({(o.gpu, o.market, o.provider, o.region) for o in offers})
    rng = random.Random(5)
    seen: set[str] = set()
    for i in range(100):
        spec = random_spec(rng, i)
        codes = reject_codes(book, spec)
        for row, code in enumerate(codes.tolist()):
            o = book.offer(row)
            want = reference_code(o, spec, unhealthy)
            got = CHECKS[code - 1].code if code else None
            assert got == want, (spec.name, o.id, got, want)
            seen.add(got or "ok")
    # The random specs reached every constraint the table checks before costing, and feasibility.
    assert seen >= {c.code for c in CHECKS[:16]} | {"ok"}, seen


def test_quote_counts_every_offer_and_ranks_the_feasible_by_cost(offers: list[Offer]) -> None:
    sick = {(o.provider, o.locality.host): "ECC" for o in offers[::41] if o.locality.host}
    book = OfferBook.build(offers, unhealthy_hosts=sick)
    rng = random.Random(9)
    checked = 0
    for i in range(60):
        spec = random_spec(rng, i)
        full = quote(book, spec, now=NOW, top=len(book), max_rejected=None)
        some = quote(book, spec, now=NOW, top=5, max_rejected=7)
        assert sum(full.rejected_counts.values()) + len(full.options) == len(book)
        assert full.rejected_counts == some.rejected_counts  # counts never depend on what is written out
        assert len(full.rejected) == sum(full.rejected_counts.values()) and len(some.rejected) <= 7
        codes = dict(zip(book.ids, reject_codes(book, spec).tolist(), strict=True))
        for r in full.rejected:  # written-out codes are the screen's (the cost checks come on top)
            assert r.code in ("deadline", "budget") or CHECKS[codes[r.offer_id] - 1].code == r.code
        assert [o.offer_id for o in some.options] == [o.offer_id for o in full.options[:5]]
        costs = [o.expected_cost_usd for o in full.options]
        assert costs == sorted(costs)
        ids = {o.offer_id for o in full.options} | {r.offer_id for r in full.rejected}
        assert len(ids) == len(book)  # each offer once: an option or a rejection
        checked += bool(full.options)
    assert checked >= 10


def test_written_rejections_put_near_misses_first() -> None:
    offers = [
        *make_offers(50, seed=3),
        Offer(id="near", provider="aws", market=Market.on_demand, sku="p5", gpu="H100-SXM", gpu_count=4,
              usd_per_hour=40.0, locality=Locality(provider="aws", region="us-east-1")),
    ]
    spec = parse_spec({"name": "n", "gpu": "H100-SXM", "gpus": 8, "markets": ["on_demand"],
                       "workload": {"hours": 1}})
    q = quote(OfferBook.build(offers), spec, now=NOW, max_rejected=3)
    assert q.rejected[0].offer_id == "near" and q.rejected[0].code == "gpus_per_node"
    assert len(q.rejected) == 3


def test_book_from_columns_needs_no_offers_and_quotes_the_same(offers: list[Offer]) -> None:
    from_offers = OfferBook.build(offers)
    columns = offer_columns(offers)
    bare = OfferBook.from_columns(columns)
    assert bare.source is None
    rng = random.Random(2)
    for i in range(30):
        spec = random_spec(rng, i)
        a, b = quote(from_offers, spec, now=NOW, max_rejected=5), quote(bare, spec, now=NOW, max_rejected=5)
        assert a.model_dump(exclude={"at"}) == b.model_dump(exclude={"at"})
    # A row made back into an Offer carries what the columns hold.
    row = next(r for r in range(len(bare)) if bare.ids[r] == "o7")
    made, original = bare.offer(row), offers[7]
    assert made.model_dump(exclude={"attrs", "observed_at", "perf"}) == original.model_dump(
        exclude={"attrs", "observed_at", "perf"}) | {"gpu_memory_gb": made.gpu_memory_gb}


def test_a_book_from_arrays_alone_fits_in_a_kilobyte_per_offer() -> None:
    n = 50_000
    rng = np.random.default_rng(1)
    gpus = np.array(["H100-SXM", "L40S", "MI300X", "T4"])
    book = OfferBook.from_columns({
        "id": [f"x{i}" for i in range(n)], "provider": ["p"] * n, "gpu": gpus[rng.integers(0, 4, n)].tolist(),
        "gpu_count": rng.choice([1, 8], n), "price": rng.uniform(1, 50, n), "market": rng.integers(0, 4, n),
    })
    assert book.nbytes() / n < 1024
    q = quote(book, parse_spec({"name": "x", "gpu": "MI300X:8", "workload": {"hours": 1}}), now=NOW, top=3)
    assert len(q.options) == 3 and {o.gpu for o in q.options} == {"MI300X"}
    assert q.options[0].usd_per_hour == pytest.approx(float(book["price"][
        (book["gpu"] == book.gpus.index["MI300X"]) & (book["gpu_count"] == 8)].min()), abs=1e-4)


def test_health_overlays_swap_columns_not_the_book(offers: list[Offer]) -> None:
    multi = Offer(id="multi", provider="slurm", market=Market.owned, sku="gpu", gpu="H100-SXM", gpu_count=8,
                  usd_per_hour=10.0, locality=Locality(provider="slurm", region="onprem"),
                  attrs={"nodes": "n1,n2"})
    spot = Offer(id="spot", provider="aws", market=Market.spot, sku="p5", gpu="H100-SXM", gpu_count=8,
                 interruptible=True, usd_per_hour=30.0, locality=Locality(provider="aws", zone="use1-az1"))
    base = OfferBook.build([*offers[:100], multi, spot])
    healthy = base.with_health({("slurm", "n2"): "ECC"}, {("aws", "use1-az1", "p5"): 0.7})
    row = {i: r for r, i in enumerate(healthy.ids)}
    assert healthy["unhealthy"][row["multi"]] and not base["unhealthy"][row["multi"]]
    assert healthy["preempt_rate"][row["spot"]] == 0.7 and base["preempt_rate"][row["spot"]] == 0.05
    assert healthy["price"] is base["price"]  # the rest is shared, not copied
    spec = parse_spec({"name": "h", "gpu": "H100-SXM", "gpus": 8, "markets": ["owned"], "workload": {"hours": 1}})
    q = quote(healthy, spec, now=NOW, max_rejected=None)
    assert {r.offer_id: r.code for r in q.rejected}["multi"] == "unhealthy"


def test_unknown_gpu_names_match_offers_of_that_spelling() -> None:
    offers = [Offer(id="z", provider="neo", market=Market.on_demand, sku="z", gpu="Z80", gpu_count=1,
                    usd_per_hour=1.0, locality=Locality(provider="neo"))]
    q = quote(OfferBook.build(offers), parse_spec({"name": "z", "gpu": "z-80", "gpus": 1, "workload": {"hours": 1}}),
              now=NOW)
    assert [o.offer_id for o in q.options] == ["z"] and q.notes == []


def test_catalog_quotes_unchanged_in_substance() -> None:
    """The bundled catalog's 70B example still gets RDMA options in one cluster and no marketplace box."""
    book = OfferBook.build(catalog_offers())
    spec = parse_spec({"name": "x", "gpu": ["H100", "H200"], "gpus": 64, "gpus_per_node": 8, "fabric": "rdma",
                       "min_fabric_gbps": 400, "colocate": "cluster", "workload": {"params_b": 70, "tokens_b": 20},
                       "markets": ["reserved", "owned", "on_demand"]})
    q = quote(book, spec, now=NOW, top=20, max_rejected=None)
    assert q.options and all(o.fabric is Fabric.efa and o.nodes == 8 for o in q.options)
    assert q.rejected_counts.get("market", 0) > 0 and "deadline" not in q.rejected_counts
    assert CODE_OF["region"] < CODE_OF["unhealthy"] < CODE_OF["gpu_model"] < CODE_OF["runtime"]
