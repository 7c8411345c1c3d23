"""Multi-node jobs assembled from single marketplace machines (issue 17, item 5): which jobs may be, from which
machines, at what price, and never for a job that needs its nodes together or an RDMA fabric."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from broker.models import Colocate, Fabric, Locality, Market, Network, Offer
from broker.specs import parse_spec
from policies.assembly import assemblable, assemble, combine, member_ids
from policies.book import OfferBook
from policies.ranking import quote

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def machine(oid: str, price: float, region: str = "US", *, gbps: float = 1.0, reliability: float = 0.99,
            gpu: str = "RTX-4090", count: int = 1, provider: str = "mkt") -> Offer:
    return Offer(id=oid, provider=provider, market=Market.on_demand, sku=f"{count}x-{gpu}", gpu=gpu,
                 gpu_count=count, usd_per_hour=price, max_nodes=1, colocation=Colocate.node,
                 locality=Locality(provider=provider, region=region, host=oid),
                 network=Network(fabric=Fabric.ethernet, fabric_gbps=gbps, inet_down_mbps=gbps * 1000),
                 reliability=reliability, egress_usd_per_gb=0.01)


def cluster_offer(price: float = 30.0) -> Offer:
    """A cloud's multi-node capacity: nodes together in one placement group on InfiniBand."""
    return Offer(id="cloud:ib", provider="cloud", market=Market.on_demand, sku="1x-ib", gpu="RTX-4090",
                 gpu_count=1, usd_per_hour=price, max_nodes=8, colocation=Colocate.cluster,
                 locality=Locality(provider="cloud", region="us-east-1", zone="us-east-1a"),
                 network=Network(fabric=Fabric.infiniband, fabric_gbps=400.0))


MACHINES = [
    machine("m:de1", 0.30, "DE"), machine("m:us1", 0.35, "US", gbps=0.5), machine("m:us2", 0.40, "US"),
    machine("m:de2", 0.46, "DE"), machine("m:us3", 0.50, "US"), machine("m:us4", 0.60, "US"),
]


def book(offers: list[Offer], assemblers: frozenset[str] = frozenset({"mkt"})) -> OfferBook:
    return replace(OfferBook.build(offers), assemblers=assemblers)


def spec(**fields: Any):
    data: dict[str, Any] = {"name": "asm", "gpu": "RTX-4090", "gpus": 2, "gpus_per_node": 1, "colocate": "any",
                            "fabric": "ethernet", "workload": {"hours": 1}}
    data.update(fields)
    return parse_spec(data)


def assembled(q) -> list:
    return [o for o in q.options if "+" in o.offer_id]


def test_a_two_node_job_that_allows_any_colocation_gets_the_two_cheapest_machines_priced_as_their_sum() -> None:
    q = quote(book(MACHINES), spec(), now=NOW, top=20)
    opts = assembled(q)
    assert opts, q.rejected_counts
    best = opts[0]
    assert member_ids(best.offer_id) == ["m:de1", "m:us1"]  # the two cheapest, wherever they are
    assert best.nodes == 2 and best.usd_per_hour == pytest.approx(0.30 + 0.35)  # the job's $/h: the sum
    assert best.fabric is Fabric.ethernet and best.fabric_gbps == 0.5  # the slower machine's link
    assert best.region == "DE+US"  # scattered: no data location is local to it
    assert any("separately rented machines" in n for n in best.breakdown.notes)
    # The single machines themselves still cannot run a 2-node job.
    assert q.rejected_counts.get("nodes") == len(MACHINES)


def test_region_colocation_keeps_every_assembly_in_one_region() -> None:
    opts = assembled(quote(book(MACHINES), spec(colocate="region"), now=NOW, top=20))
    assert opts
    assert next(member_ids(o.offer_id) for o in opts) == ["m:us1", "m:us2"]  # cheapest same-region pair
    assert {o.region for o in opts} <= {"US", "DE"}
    assert all("+" not in o.region for o in opts)


def test_a_spec_that_restricts_regions_assembles_only_inside_them() -> None:
    opts = assembled(quote(book(MACHINES), spec(regions=["DE"]), now=NOW, top=20))
    assert [member_ids(o.offer_id) for o in opts] == [["m:de1", "m:de2"]]
    assert opts[0].region == "DE"


@pytest.mark.parametrize("colocate", ["cluster", "rack", "node"])
def test_a_job_that_needs_its_nodes_together_never_lands_on_scattered_machines(colocate: str) -> None:
    q = quote(book([*MACHINES, cluster_offer()]), spec(colocate=colocate), now=NOW, top=20)
    assert not assembled(q)
    assert [o.offer_id for o in q.options] == (["cloud:ib"] if colocate == "cluster" else [])
    assert assemble(book(MACHINES), spec(colocate=colocate)) is None


@pytest.mark.parametrize("fabric", ["infiniband", "rdma", "efa"])
def test_a_job_that_needs_an_rdma_fabric_never_lands_on_scattered_machines(fabric: str) -> None:
    s = spec(fabric=fabric)
    assert not assemblable(s)
    q = quote(book([*MACHINES, cluster_offer()]), s, now=NOW, top=20)
    assert not assembled(q)
    assert assemble(book(MACHINES), s) is None


def test_only_the_providers_the_market_marks_by_capability_are_assembled() -> None:
    assert not assembled(quote(book(MACHINES, assemblers=frozenset()), spec(), now=NOW, top=20))
    others = [machine(f"x:{i}", 0.1, provider="other") for i in range(3)]
    opts = assembled(quote(book([*MACHINES, *others]), spec(), now=NOW, top=20))
    assert opts and all(o.provider == "mkt" for o in opts)


def test_taken_machines_are_left_out_and_the_next_ones_assembled() -> None:
    opts = assembled(quote(book(MACHINES), spec(), now=NOW, top=20, exclude={"m:de1"}))
    assert member_ids(opts[0].offer_id) == ["m:us1", "m:us2"]
    assert all("m:de1" not in member_ids(o.offer_id) for o in opts)


def test_disjoint_fallback_assemblies_per_group() -> None:
    made = assemble(book(MACHINES), spec(colocate="region"))
    assert made is not None
    us = sorted(member_ids(i) for i, r in zip(made.ids, made.texts("region", np.arange(len(made))), strict=True)
                if r == "US")
    assert us == [["m:us1", "m:us2"], ["m:us3", "m:us4"]]  # a failed rent has a next, with other machines


def test_the_price_cap_is_on_the_sum_and_per_node_constraints_on_each_machine() -> None:
    # $0.70/h for the job: 0.30 + 0.35 fits, no other pair does.
    opts = assembled(quote(book(MACHINES), spec(max_usd_per_hour=0.70), now=NOW, top=20))
    assert [member_ids(o.offer_id) for o in opts] == [["m:de1", "m:us1"]]
    # A link floor: the 0.5 Gbit/s machine may not be a member.
    opts = assembled(quote(book(MACHINES), spec(min_fabric_gbps=0.8), now=NOW, top=20))
    assert all("m:us1" not in member_ids(o.offer_id) for o in opts) and opts
    # Other GPU models and counts do not mix with the job's.
    mixed = [machine("m:a", 0.1, gpu="RTX-3090"), machine("m:b", 0.1, count=2), machine("m:c", 0.2)]
    assert not assembled(quote(book(mixed), spec(), now=NOW, top=20))


def test_combined_reliability_is_the_chance_no_machine_fails_and_the_floor_applies_to_it() -> None:
    a, b = machine("m:a", 0.3, reliability=0.97), machine("m:b", 0.3, reliability=0.96)
    made = combine([a, b])
    assert made.reliability == pytest.approx(0.97 * 0.96)
    assert made.max_nodes == 2 and made.colocation is Colocate.region and made.region == "US"
    assert not assembled(quote(book([a, b]), spec(min_reliability=0.95), now=NOW, top=5))
    assert assembled(quote(book([a, b]), spec(min_reliability=0.93), now=NOW, top=5))


def test_the_cost_model_charges_the_internet_between_machines() -> None:
    """A training job's all-reduce over two scattered machines' internet links costs communication hours that
    a cluster's InfiniBand does not: the ranking sees it, whatever the sticker price."""
    train = {"params_b": 1.0, "tokens_b": 2.0}
    q = quote(book([*MACHINES, cluster_offer(price=0.5)]), spec(workload=train), now=NOW, top=20)
    by_id = {o.offer_id: o for o in q.options}
    pair = assembled(q)[0]
    ib = by_id["cloud:ib"]
    assert pair.breakdown.comm_hours > 10 * ib.breakdown.comm_hours
    assert math.isfinite(pair.expected_cost_usd) and pair.expected_hours > ib.expected_hours


def test_the_ranked_figures_of_an_assembly_agree_with_the_offer_the_router_launches() -> None:
    """The ranking reduces columns; the router makes the chosen assembly again from its machines (combine):
    both must say the same price, link, reliability, shape and region."""
    made = assemble(book(MACHINES), spec())
    assert made is not None
    by_id = {o.id: o for o in MACHINES}
    for row in range(len(made)):
        offer = combine([by_id[i] for i in member_ids(made.ids[row])])
        r = made.row(row)
        assert (r.usd_per_hour, r.fabric_gbps, r.max_nodes, r.region, r.colocation, r.fabric) == pytest.approx(
            (offer.usd_per_hour, offer.network.fabric_gbps, offer.max_nodes, offer.region, offer.colocation,
             offer.network.fabric))
        assert r.reliability == pytest.approx(offer.reliability)


def test_data_location_counts_for_assemblies_as_for_any_offer() -> None:
    cloud = cluster_offer().model_copy(update={"egress_usd_per_gb": 0.05})
    size = 1000
    local = spec(colocate="region", data={"location": "mkt:US", "size_gb": size})
    egress = {o.offer_id: o.breakdown.egress_usd for o in assembled(quote(book([*MACHINES, cloud]), local, now=NOW,
                                                                          top=20))}
    assert egress["m:us1+m:us2"] == 0.0  # both machines in the data's country
    assert egress["m:de1+m:de2"] == size * 0.01  # the machines' own site's egress
    # Data in a cloud region: what that cloud declares, as for the cloud's own offers elsewhere.
    far = spec(data={"location": "cloud:us-west-2", "size_gb": size})
    q = quote(book([*MACHINES, cloud]), far, now=NOW, top=20)
    assert {o.breakdown.egress_usd for o in assembled(q)} == {size * 0.05}
