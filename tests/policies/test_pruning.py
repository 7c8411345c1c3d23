"""Pruning never changes a quote: the book folded by shape (policies/book.py, PrunedView) gives the very
answer the plain pass over every offer gives — the same top options in the same order, the same counts
per reason, the same feasible sources — over random books and random jobs.

The books are built to make pruning work hard: few shapes, many offers of each, prices drawn from a small
set (exact ties) and nudged by one ulp (costs equal to the cent but not exactly), health and spot rates
laid over them, some offers of a shape stale and others not.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.models import Colocate, Fabric, IntraNode, Locality, Market, Network, Offer, OfferSource, Perf
from broker.specs import parse_spec
from policies.book import OfferBook
from policies.ranking import quote_parts

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
GPUS = ["H100-SXM", "A100-SXM-80GB", "L40S", "RTX-4090", "MI300X", "T4", "Z80"]
PRICES = [0.5, 1.0, 1.0000000000000002, 2.4, 8.0, 8.000000000000002, 31.0]


@st.composite
def shapes(draw: st.DrawFn) -> dict[str, Any]:
    market = draw(st.sampled_from(list(Market)))
    provider = draw(st.sampled_from(["aws", "vast", "slurm"]))
    return {
        "provider": provider, "market": market, "gpu": draw(st.sampled_from(GPUS)),
        "gpu_count": draw(st.sampled_from([1, 2, 8])), "gpu_memory_gb": draw(st.sampled_from([0, 24, 80])),
        "divisible": market is Market.owned, "interruptible": market is Market.spot,
        "max_nodes": draw(st.sampled_from([1, 4])), "colocation": draw(st.sampled_from(list(Colocate))),
        "region": draw(st.sampled_from(["us-east-1", "us-west-2", "US"])),
        "fabric": draw(st.sampled_from([Fabric.ethernet, Fabric.infiniband, Fabric.none])),
        "fabric_gbps": draw(st.sampled_from([0.0, 10.0, 400.0])),
        "intra": draw(st.sampled_from(list(IntraNode))),
        "reliability": draw(st.sampled_from([None, 0.9, 0.99])),
        "tflops": draw(st.sampled_from([None, 300.0, 900.0])),
        "queue": draw(st.sampled_from([0.0, 0.0, 3.0])),
        "down": draw(st.sampled_from([None, 800.0])),
        "source": draw(st.sampled_from(list(OfferSource))),
        "no_image": provider == "slurm" and draw(st.booleans()),
    }


def offer(i: int, s: dict[str, Any], price: float, stale: bool, host: str, zone: str) -> Offer:
    return Offer(
        id=f"o{i}", provider=s["provider"], market=s["market"], sku=f"{s['gpu_count']}x{s['gpu']}", gpu=s["gpu"],
        gpu_count=s["gpu_count"], gpu_memory_gb=s["gpu_memory_gb"], usd_per_hour=price, divisible=s["divisible"],
        interruptible=s["interruptible"], max_nodes=s["max_nodes"], colocation=s["colocation"],
        locality=Locality(provider=s["provider"], region=s["region"], zone=zone, host=host),
        network=Network(intra=s["intra"], fabric=s["fabric"], fabric_gbps=s["fabric_gbps"],
                        inet_down_mbps=s["down"]),
        reliability=s["reliability"], queue_wait_hours=s["queue"], stale=stale, source=s["source"],
        perf=Perf(source="probe", tflops_bf16=s["tflops"]) if s["tflops"] else None,
        observed_at=NOW - timedelta(hours=1), attrs={"containers": "none"} if s["no_image"] else {},
    )


@st.composite
def kinds_of_offer(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A few shapes, most of them one or two fields away from the first: offers that differ in a single
    column the ranking reads must never be folded together."""
    base = draw(shapes())
    out = [base]
    for _ in range(draw(st.integers(0, 6))):
        other = draw(shapes())
        fields = draw(st.lists(st.sampled_from(sorted(base)), min_size=1, max_size=2))
        out.append({**base, **{f: other[f] for f in fields}})
    for k in out:  # what follows from the market (as the providers set it)
        k["divisible"], k["interruptible"] = k["market"] is Market.owned, k["market"] is Market.spot
    return out


@st.composite
def books(draw: st.DrawFn) -> OfferBook:
    kinds = draw(kinds_of_offer())
    n = draw(st.integers(1, 120))
    offers = []
    for i in range(n):
        s = draw(st.sampled_from(kinds))
        offers.append(offer(i, s, draw(st.sampled_from(PRICES)), stale=draw(st.booleans()) and i % 5 == 0,
                            host=f"h{i % 7}", zone=draw(st.sampled_from(["a", "b"]))))
    unhealthy = {("vast", f"h{k}"): "bad" for k in draw(st.sets(st.integers(0, 6), max_size=2))}
    rates = {("aws", z, sku): draw(st.sampled_from([0.0, 0.5])) for z in ("a",) for sku in ("8xH100-SXM", "1xT4")}
    return OfferBook.build(offers, unhealthy_hosts=unhealthy, preemption_rates=rates)


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    gpn = draw(st.sampled_from([1, 2, 8]))
    nodes = draw(st.sampled_from([1, 1, 2]))
    spec: dict[str, Any] = {
        "name": "prop", "gpu": draw(st.sampled_from(["any", "any", ["H100", "A100"], ["L40S", "RTX-4090", "T4"]])),
        "gpus": gpn * nodes, "gpus_per_node": gpn, "interruptible": draw(st.booleans()),
        "workload": draw(st.sampled_from([{"hours": 5}, {"params_b": 1, "tokens_b": 2},
                                          {"reference_gpu_hours": 40}])),
    }
    if nodes > 1:
        spec.update(fabric="any", colocate=draw(st.sampled_from(["any", "cluster"])))
    if draw(st.booleans()):
        spec["min_gpu_memory_gb"] = draw(st.sampled_from([16, 40]))
    if draw(st.booleans()):
        spec["deadline_in"] = draw(st.sampled_from(["2h", "6h", "3d"]))
    if draw(st.booleans()):
        spec["data"] = {"location": draw(st.sampled_from(["aws:us-east-1", "onprem"])), "size_gb": 500}
    if draw(st.booleans()):
        spec["image"] = "nvcr.io/nvidia/pytorch:24.05-py3"
    if draw(st.booleans()):
        spec["min_reliability"] = 0.95
    return spec


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(book=books(), job=jobs(), top=st.sampled_from([1, 3, 10]))
def test_pruned_quote_is_the_plain_quote(book: OfferBook, job: dict[str, Any], top: int) -> None:
    spec = parse_spec(job)
    pruned = quote_parts(book, spec, now=NOW, top=top, max_rejected=0, prune=True)
    plain = quote_parts(book, spec, now=NOW, top=top, max_rejected=0, prune=False)
    assert pruned.json() == plain.json()


def test_the_view_folds_offers_of_one_shape_and_keeps_the_cheapest_first() -> None:
    s = {"provider": "aws", "market": Market.on_demand, "gpu": "L40S", "gpu_count": 1, "gpu_memory_gb": 0,
         "divisible": False, "interruptible": False, "max_nodes": 1, "colocation": Colocate.node,
         "region": "us-east-1", "fabric": Fabric.none, "fabric_gbps": 0.0, "intra": IntraNode.pcie,
         "reliability": None, "tflops": None, "queue": 0.0, "down": None, "source": OfferSource.live,
         "no_image": False}
    faster = {**s, "tflops": 400.0}
    offers = [offer(0, s, 3.0, False, "", "a"), offer(1, s, 2.0, False, "", "b"), offer(2, faster, 2.5, False, "", "a"),
              offer(3, s, 2.0, False, "", "c")]
    book = OfferBook.build(offers)
    view = book.pruned()
    assert len(view.reps) == 2  # the three of one shape, and the faster one
    assert sorted(view.size.tolist()) == [1, 3]
    k = view.reps.ids.index("o1")  # its shape's cheapest, the first row among equal prices
    assert [book.ids[r] for r in view.members[view.start[k]:view.start[k] + view.size[k]]] == ["o1", "o3", "o0"]
    assert book.with_health({("aws", "x"): "bad"}).pruned() is not view  # a new book version, a new view
    assert book.pruned() is view  # kept with the book


def test_a_price_cap_or_a_budget_takes_the_plain_pass() -> None:
    """They split a shape class by price, so the view cannot answer them; the quote is the same either way."""
    s = {"provider": "aws", "market": Market.on_demand, "gpu": "L40S", "gpu_count": 1, "gpu_memory_gb": 0,
         "divisible": False, "interruptible": False, "max_nodes": 1, "colocation": Colocate.node,
         "region": "us-east-1", "fabric": Fabric.none, "fabric_gbps": 0.0, "intra": IntraNode.pcie,
         "reliability": None, "tflops": None, "queue": 0.0, "down": None, "source": OfferSource.live,
         "no_image": False}
    book = OfferBook.build([offer(i, s, p, False, "", "a") for i, p in enumerate([1.0, 2.0, 3.0, 4.0])])
    for extra in ({"max_usd_per_hour": 2.5}, {"max_total_usd": 25}):
        spec = parse_spec({"name": "cap", "gpu": "any", "gpus": 1, "workload": {"hours": 10}, **extra})
        a = quote_parts(book, spec, now=NOW, max_rejected=0, prune=True)
        b = quote_parts(book, spec, now=NOW, max_rejected=0, prune=False)
        assert a.json() == b.json()
        assert len(a.options) == 2 and sum(a.rejected_counts.values()) == 2
        assert not math.isnan(a.options[0]["expected_cost_usd"])
    assert np.array_equal(book.pruned().size, [4])


SHAPE_FIELDS = ["provider", "market", "gpu", "gpu_count", "gpu_memory_gb", "max_nodes", "colocation", "region",
                "fabric", "fabric_gbps", "intra", "reliability", "tflops", "queue", "down", "source", "no_image"]


@st.composite
def twin_books(draw: st.DrawFn, field: str) -> OfferBook:
    """Two shapes one field apart, several offers of each: the sharpest test of what may be folded."""
    base = draw(shapes())
    other = draw(shapes().filter(lambda o: o[field] != base[field]))
    kinds = [base, {**base, field: other[field]}]
    for k in kinds:
        k["divisible"], k["interruptible"] = k["market"] is Market.owned, k["market"] is Market.spot
    n = draw(st.integers(2, 12))
    return OfferBook.build([offer(i, kinds[i % 2], draw(st.sampled_from(PRICES)), stale=False, host="",
                                  zone="a") for i in range(n)])


@pytest.mark.parametrize("field", SHAPE_FIELDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_pruning_two_shapes_one_field_apart(field: str, data: st.DataObject) -> None:
    book = data.draw(twin_books(field))
    spec = parse_spec(data.draw(jobs()))
    for top in (1, 2):
        pruned = quote_parts(book, spec, now=NOW, top=top, max_rejected=0, prune=True)
        plain = quote_parts(book, spec, now=NOW, top=top, max_rejected=0, prune=False)
        assert pruned.json() == plain.json()
