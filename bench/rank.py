"""Quote latency over a large offer book.

Builds a book of 50,000 offers (the bundled catalog's real offers, replicated
across synthetic regions, zones, racks and price levels, plus on-prem and
marketplace nodes), then quotes 1,000 varied job specs against it on one core.
Prints median and p99 milliseconds per quote and offers evaluated per second.

    python bench/rank.py [--offers 50000] [--jobs 1000] [--seed 7]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from datetime import UTC, datetime

from broker.models import Colocate, Fabric, IntraNode, Locality, Market, Network, Offer
from broker.specs import parse_spec
from policies.book import OfferBook
from policies.ranking import quote
from providers.catalog import CatalogProvider

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def synthetic_book(n: int, rng: random.Random) -> list[Offer]:
    base = asyncio.run(CatalogProvider().offers())
    offers: list[Offer] = []
    i = 0
    while len(offers) < n:
        o = rng.choice(base)
        i += 1
        kind = rng.random()
        if kind < 0.15:  # on-prem nodes: divisible, rack-local
            rack = f"rack{rng.randint(1, 40)}"
            fabric = rng.choice([Fabric.infiniband, Fabric.roce, Fabric.ethernet])
            offers.append(o.model_copy(update={
                "id": f"syn-slurm-{i}", "provider": "slurm", "market": Market.owned, "divisible": True,
                "gpu_count": rng.choice([2, 4, 8]), "max_nodes": rng.choice([1, 2, 4, 8, 16]),
                "colocation": rng.choice([Colocate.rack, Colocate.cluster]),
                "usd_per_hour": round(rng.uniform(8, 20), 2), "queue_wait_hours": rng.choice([0, 0, 0.5, 3, 12]),
                "locality": Locality(provider="slurm", region="onprem", zone=rng.choice(["gpu", "ib"]), rack=rack),
                "network": Network(intra=IntraNode.nvlink, fabric=fabric, fabric_gbps=400.0),
            }))
        elif kind < 0.45:  # marketplace boxes: single node, ethernet
            offers.append(o.model_copy(update={
                "id": f"syn-vast-{i}", "provider": "vast", "market": rng.choice([Market.on_demand, Market.spot]),
                "interruptible": rng.random() < 0.3, "max_nodes": 1, "colocation": Colocate.node,
                "usd_per_hour": round(o.usd_per_hour * rng.uniform(0.3, 0.9), 3),
                "reliability": round(rng.uniform(0.8, 0.999), 3),
                "locality": Locality(provider="vast", region=rng.choice(["US", "EU", "AS"]), host=f"m{i}"),
                "network": Network(fabric=Fabric.ethernet, fabric_gbps=rng.choice([1.0, 2.5, 10.0]),
                                   inet_down_mbps=rng.uniform(100, 5000)),
            }))
        else:  # cloud offers in more zones and price levels
            offers.append(o.model_copy(update={
                "id": f"syn-{o.provider}-{i}",
                "usd_per_hour": round(o.usd_per_hour * rng.uniform(0.7, 1.3), 3),
                "locality": Locality(provider=o.provider, region=o.locality.region or "us-east-1",
                                     zone=f"{o.locality.region or 'x'}-{rng.choice('abcdef')}{rng.randint(1, 9)}"),
            }))
    return offers[:n]


def job_specs(n: int, rng: random.Random) -> list:
    gpus_choices = [["H100", "H200"], ["A100"], ["L40S", "A10G", "L4"], ["RTX-4090", "RTX-3090"], ["H100"],
                    ["A100", "H100"], ["T4"], ["V100"]]
    specs = []
    for i in range(n):
        gpn = rng.choice([1, 2, 4, 8])
        nodes = rng.choice([1, 1, 1, 2, 4, 8]) if gpn == 8 else 1
        multi = nodes > 1
        data = {
            "name": f"bench-{i}", "gpu": rng.choice(gpus_choices), "gpus": gpn * nodes, "gpus_per_node": gpn,
            "fabric": rng.choice(["rdma", "infiniband", "efa"]) if multi else "any",
            "colocate": rng.choice(["cluster", "rack", "zone"]) if multi else "any",
            "interruptible": rng.random() < 0.4,
            "markets": rng.choice([["spot", "on_demand", "reserved", "owned"], ["on_demand", "owned"], ["spot"]]),
            "workload": rng.choice([{"params_b": rng.choice([1, 7, 13, 70]), "tokens_b": rng.choice([1, 10, 50])},
                                    {"reference_gpu_hours": rng.uniform(1, 500)}, {"hours": rng.uniform(1, 200)}]),
        }
        if rng.random() < 0.3:
            data["max_usd_per_hour"] = rng.choice([1, 5, 50, 500])
        if rng.random() < 0.3:
            data["deadline_in"] = rng.choice(["12h", "48h", "7d"])
        if rng.random() < 0.3:
            data["data"] = {"location": rng.choice(["aws:us-east-1", "onprem", "aws:us-west-2"]),
                            "size_gb": rng.choice([10, 500, 5000])}
        specs.append(parse_spec(data))
    return specs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--offers", type=int, default=50_000)
    ap.add_argument("--jobs", type=int, default=1_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-rejected", type=int, default=100, help="rejections spelled out per quote (API default)")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    t0 = time.perf_counter()
    offers = synthetic_book(args.offers, rng)
    t1 = time.perf_counter()
    book = OfferBook.build(offers)
    t2 = time.perf_counter()
    specs = job_specs(args.jobs, rng)

    for s in specs[:20]:  # warm-up
        quote(book, s, now=NOW, max_rejected=args.max_rejected)
    times = []
    feasible = 0
    for s in specs:
        start = time.perf_counter()
        q = quote(book, s, now=NOW, max_rejected=args.max_rejected)
        times.append((time.perf_counter() - start) * 1000)
        feasible += bool(q.options)
    times.sort()
    median = statistics.median(times)
    p99 = times[int(len(times) * 0.99) - 1]
    print(f"offers in book:              {len(book):,}")
    print(f"book generation:             {t1 - t0:.2f} s; columnar build: {t2 - t1:.2f} s")
    print(f"job specs quoted:            {len(specs):,} ({feasible} with options)")
    print(f"quote latency median:        {median:.2f} ms")
    print(f"quote latency p99:           {p99:.2f} ms")
    print(f"offers evaluated per second: {len(book) * len(specs) / (sum(times) / 1000):,.0f}")
    print("target: median <= 10 ms per quote on one core")


if __name__ == "__main__":
    main()
