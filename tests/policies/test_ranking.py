"""Constraints and ranking over hand-made offers: feasibility, reasons, job-cost order."""

from __future__ import annotations

from datetime import UTC, datetime

from broker.models import (
    Colocate,
    Fabric,
    IntraNode,
    Locality,
    Market,
    Network,
    Offer,
    Perf,
)
from broker.specs import parse_spec
from policies.book import OfferBook
from policies.ranking import quote

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def offer(oid: str, **kw) -> Offer:
    base = dict(
        id=oid, provider="aws", market=Market.on_demand, sku="p5.48xlarge", gpu="H100-SXM", gpu_count=8,
        gpu_memory_gb=80, usd_per_hour=98.32, max_nodes=16, colocation=Colocate.cluster,
        locality=Locality(provider="aws", region="us-east-1", zone="us-east-1a"),
        network=Network(intra=IntraNode.nvlink, fabric=Fabric.efa, fabric_gbps=3200),
    )
    base.update(kw)
    return Offer(**base)


def spec(**kw):
    data = dict(name="t", gpu=["H100"], gpus=64, gpus_per_node=8, fabric="rdma", colocate="cluster",
                workload={"params_b": 70, "tokens_b": 1})
    data.update(kw)
    return parse_spec(data)


def test_multinode_rdma_job_rejects_marketplace_and_ethernet_with_reasons() -> None:
    offers = [
        offer("ok"),
        offer("vast", provider="vast", market=Market.on_demand, usd_per_hour=16.0, max_nodes=1,
              colocation=Colocate.node, network=Network(fabric=Fabric.ethernet, fabric_gbps=1)),
        offer("eth", sku="g6e.48xlarge", gpu="H100-SXM", network=Network(fabric=Fabric.ethernet, fabric_gbps=100),
              usd_per_hour=30.0),
        offer("scattered", colocation=Colocate.region, usd_per_hour=50.0),
    ]
    q = quote(OfferBook.build(offers), spec(), now=NOW)
    assert [o.offer_id for o in q.options] == ["ok"]
    why = {r.offer_id: (r.code, r.reason) for r in q.rejected}
    assert why["vast"][0] == "nodes" and "only 1 node" in why["vast"][1]
    assert why["eth"][0] == "fabric" and "does not meet 'rdma'" in why["eth"][1]
    assert why["scattered"][0] == "colocation"
    assert q.rejected_counts == {"nodes": 1, "fabric": 1, "colocation": 1}


def test_cheaper_sticker_behind_slow_fabric_loses_on_job_cost() -> None:
    fast = offer("ib", network=Network(intra=IntraNode.nvlink, fabric=Fabric.infiniband, fabric_gbps=3200))
    slow = offer("roce", usd_per_hour=90.0, network=Network(intra=IntraNode.nvlink, fabric=Fabric.roce,
                                                          fabric_gbps=200))
    q = quote(OfferBook.build([slow, fast]), spec(), now=NOW)
    assert [o.offer_id for o in q.options] == ["ib", "roce"]
    assert q.options[0].usd_per_hour > q.options[1].usd_per_hour
    assert q.options[0].expected_cost_usd < q.options[1].expected_cost_usd


def test_measured_fast_beats_measured_slow_at_same_price_and_says_why() -> None:
    fast = offer("fast", perf=Perf(source="probe", tflops_bf16=950))
    slow = offer("slow", perf=Perf(source="probe", tflops_bf16=500))
    q = quote(OfferBook.build([slow, fast]), spec(gpus=8, fabric="any", colocate="any"), now=NOW)
    assert [o.offer_id for o in q.options] == ["fast", "slow"]
    assert any("measured 950 TFLOP/s" in n for n in q.options[0].breakdown.notes)


def test_data_locality_and_egress_count() -> None:
    near = offer("near", usd_per_hour=100.0)
    far = offer("far", usd_per_hour=99.0, provider="vast", max_nodes=1, colocation=Colocate.node,
                locality=Locality(provider="vast", region="EU"), egress_usd_per_gb=0.0)
    s = spec(gpus=8, fabric="any", colocate="any", data={"location": "aws:us-east-1", "size_gb": 50_000})
    q = quote(OfferBook.build([far, near]), s, now=NOW)
    assert q.options[0].offer_id == "near"
    far_opt = next(o for o in q.options if o.offer_id == "far")
    assert far_opt.breakdown.egress_usd == 50_000 * 0.09


def test_owned_divisible_node_is_paid_per_gpu() -> None:
    owned = offer("owned", provider="slurm", market=Market.owned, usd_per_hour=16.0, divisible=True, gpu_count=8,
                  max_nodes=1, colocation=Colocate.node)
    q = quote(OfferBook.build([owned]), spec(gpus=2, gpus_per_node=2, fabric="any", colocate="any"), now=NOW)
    assert q.options[0].usd_per_hour == 4.0


def test_deadline_price_cap_and_spot_rules() -> None:
    spot = offer("spot", market=Market.spot, interruptible=True, usd_per_hour=30.0)
    dear = offer("dear", usd_per_hour=500.0)
    normal = offer("normal")
    s = spec(gpus=8, fabric="any", colocate="any", max_usd_per_hour=200, deadline_in="1h")
    q = quote(OfferBook.build([spot, dear, normal]), s, now=NOW)
    codes = {r.offer_id: r.code for r in q.rejected}
    assert codes == {"spot": "interruptible", "dear": "price_cap", "normal": "deadline"}
    assert q.options == []


def test_unhealthy_host_is_rejected() -> None:
    node = offer("n1", provider="slurm", market=Market.owned, locality=Locality(provider="slurm", host="gpu-node1"))
    book = OfferBook.build([node], unhealthy_hosts={("slurm", "gpu-node1"): "ECC errors"})
    q = quote(book, spec(gpus=8, fabric="any", colocate="any"), now=NOW)
    assert q.rejected[0].code == "unhealthy"
