"""Quote latency over large offer books, each figure beside a reference measured in the same run.

Builds a book of 50,000 offers (the bundled catalog's real offers, replicated
across synthetic regions, zones, racks and price levels, plus on-prem,
marketplace and neo-cloud nodes with today's NVIDIA and AMD parts) the way the
market does (``OfferBook.build`` from offers, once), and books of 200,000 and
1,000,000 offers straight from columns (no Offer objects; the 50,000 tiled, each
copy's prices jittered). On one core it measures:

- the issue's job (8 × H100, on-demand or reserved or owned) against
  *the numpy floor* — a numpy filter and cheapest pick over the same columns of
  the rows the book's GPU index selects, as the quote does — and against
  gpuhunt's ``Catalog.query`` when gpuhunt is installed;
- 1,000 varied jobs (models and families, flexible requests, multi-node,
  deadlines, data locality) and a ``gpu: any`` job, separately; `gpu: any`
  beside a numpy pass over every row (memory, cheapest per GPU), and on the
  large books beside the plain pass without pruning (policies/book.py,
  PrunedView), with the one-time cost of folding the book;
- the same at 200,000 and 1,000,000 offers, and the book's bytes per offer.

The load average is printed at the start, after each large book and at the end.

Quotes spell out as many rejections as ``POST /v1/quotes`` does by default
(``max_rejected``, read from ``QuoteParams`` in broker/api/params.py: 0, the
per-reason summary alone) and count all of them; ``--max-rejected 20`` times
spelling out 20 as well. Each figure is timed in ``--runs``
runs, interleaved with its reference; min and median over the runs' medians
are printed.

    python bench/rank.py [--offers 50000] [--mid 200000] [--big 1000000] [--jobs 1000] [--runs 3] [--seed 7]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.api.params import QuoteParams
from broker.gpus import GPU_SPECS
from broker.models import Colocate, Fabric, IntraNode, JobSpec, Locality, Market, Network, Offer
from broker.specs import parse_spec
from policies.book import MARKETS, OfferBook
from policies.ranking import quote, quote_parts
from providers.catalog import CatalogProvider

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)
# What POST /v1/quotes spells out by default, read from the API's own parameter model so the two cannot
# drift: 0 (the summary, rejected_counts, only; details on request with ?max_rejected=N).
API_MAX_REJECTED: int = QuoteParams.model_fields["max_rejected"].default
NEO_GPUS = ("B300", "B200", "GB200", "H200", "H100-SXM", "MI300X", "MI325X", "MI355X", "L40S", "RTX-PRO-6000")
H100X8 = {"name": "h100x8", "gpu": "H100", "gpus": 8, "markets": ["on_demand", "reserved", "owned"],
          "workload": {"hours": 24}}
ANY = {"name": "any-24g", "gpu": "any", "gpus": 1, "min_gpu_memory_gb": 24, "interruptible": True,
       "workload": {"params_b": 7, "tokens_b": 1}}


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
        elif kind < 0.42:  # marketplace boxes: single node, ethernet
            offers.append(o.model_copy(update={
                "id": f"syn-vast-{i}", "provider": "vast", "market": rng.choice([Market.on_demand, Market.spot]),
                "interruptible": rng.random() < 0.3, "max_nodes": 1, "colocation": Colocate.node,
                "usd_per_hour": round(o.usd_per_hour * rng.uniform(0.3, 0.9), 3),
                "reliability": round(rng.uniform(0.8, 0.999), 3),
                "locality": Locality(provider="vast", region=rng.choice(["US", "EU", "AS"]), host=f"m{i}"),
                "network": Network(fabric=Fabric.ethernet, fabric_gbps=rng.choice([1.0, 2.5, 10.0]),
                                   inet_down_mbps=rng.uniform(100, 5000)),
            }))
        elif kind < 0.45:  # neo-clouds: today's NVIDIA and AMD parts, 8 per node, InfiniBand clusters
            gpu = rng.choice(NEO_GPUS)
            spec = GPU_SPECS[gpu]
            offers.append(Offer(
                id=f"syn-neo-{i}", provider="neo", market=rng.choice([Market.on_demand, Market.reserved]),
                sku=f"8x{gpu}", gpu=gpu, gpu_count=8, gpu_memory_gb=spec.memory_gb,
                usd_per_hour=round(8 * spec.tflops_bf16 / 400 * rng.uniform(0.8, 1.4), 2),
                max_nodes=rng.choice([1, 4, 16, 64]), colocation=Colocate.cluster,
                locality=Locality(provider="neo", region=rng.choice(["us-east", "us-west", "eu"]),
                                  cluster=f"c{rng.randint(1, 20)}"),
                network=Network(intra=IntraNode.nvlink, fabric=Fabric.infiniband, fabric_gbps=3200.0),
            ))
        else:  # cloud offers in more zones and price levels
            offers.append(o.model_copy(update={
                "id": f"syn-{o.provider}-{i}",
                "usd_per_hour": round(o.usd_per_hour * rng.uniform(0.7, 1.3), 3),
                "locality": Locality(provider=o.provider, region=o.locality.region or "us-east-1",
                                     zone=f"{o.locality.region or 'x'}-{rng.choice('abcdef')}{rng.randint(1, 9)}"),
            }))
    return offers[:n]


def grow(book: OfferBook, n: int, rng: np.random.Generator) -> OfferBook:
    """A book of ``n`` offers from ``book``'s columns, tiled with new ids and jittered prices:
    made from columns alone, as a book of a million offers must be (no Offer objects)."""
    reps = -(-n // len(book))
    pick = lambda a: np.tile(a, reps)[:n]  # noqa: E731
    data: dict[str, Any] = {"id": [f"{i}~{k}" for k in range(reps) for i in book.ids][:n], "codes": book.codes}
    for name in book.codes:
        data[name] = pick(book[name])
    for name in ("gpu_count", "market", "gpu_mem", "divisible", "interruptible", "max_nodes", "coloc", "fabric",
                 "fabric_gbps", "intra", "tflops", "measured", "fabric_lat", "reliability", "stale", "egress",
                 "queue", "inet_down_mbps", "observed_at"):
        data[name] = pick(book[name])
    data["price"] = pick(book["price"]) * rng.uniform(0.8, 1.2, n)
    return OfferBook.from_columns(data)


def job_specs(n: int, rng: random.Random) -> list[JobSpec]:
    gpus_choices: list[Any] = [["H100", "H200"], ["A100"], ["L40S", "A10G", "L4"], ["RTX-4090", "RTX-3090"],
                               ["H100"], ["A100", "H100"], ["T4"], ["V100"], ["B200", "B300", "GB200"],
                               ["MI300X", "MI325X"], "any"]
    specs = []
    for i in range(n):
        gpn = rng.choice([1, 2, 4, 8])
        nodes = rng.choice([1, 1, 1, 2, 4, 8]) if gpn == 8 else 1
        multi = nodes > 1
        gpu = rng.choice(gpus_choices)
        data: dict[str, Any] = {
            "name": f"bench-{i}", "gpu": gpu, "gpus": gpn * nodes, "gpus_per_node": gpn,
            "fabric": rng.choice(["rdma", "infiniband", "efa"]) if multi else "any",
            "colocate": rng.choice(["cluster", "rack", "zone"]) if multi else "any",
            "interruptible": rng.random() < 0.4,
            "markets": rng.choice([["spot", "on_demand", "reserved", "owned"], ["on_demand", "owned"], ["spot"]]),
            "workload": rng.choice([{"params_b": rng.choice([1, 7, 13, 70]), "tokens_b": rng.choice([1, 10, 50])},
                                    {"reference_gpu_hours": rng.uniform(1, 500)}, {"hours": rng.uniform(1, 200)}]),
        }
        if gpu == "any":
            data["min_gpu_memory_gb"] = rng.choice([16, 24, 48, 80])
        if rng.random() < 0.3:
            data["max_usd_per_hour"] = rng.choice([1, 5, 50, 500])
        if rng.random() < 0.3:
            data["deadline_in"] = rng.choice(["12h", "48h", "7d"])
        if rng.random() < 0.3:
            data["data"] = {"location": rng.choice(["aws:us-east-1", "onprem", "aws:us-west-2"]),
                            "size_gb": rng.choice([10, 500, 5000])}
        specs.append(parse_spec(data))
    return specs


def floor_h100x8(book: OfferBook) -> Callable[[], int]:
    """The reference: numpy over the same columns — GPU model, GPUs per node, market, not interruptible —
    and the cheapest row, over the rows of the book's index groups that hold those models in those markets
    (the rows the quote itself looks at: a floor scanning every row would flatter a large book). What any
    quote must at least do, with nothing explained."""
    gpu_ok = np.zeros(max(len(book.gpus), 1), dtype=bool)
    gpu_ok[book.gpu_codes(("H100-SXM", "H100-NVL", "H100-PCIe"))] = True
    market_ok = np.array([m in (Market.on_demand, Market.reserved, Market.owned) for m in MARKETS])
    groups = book.groups

    def run() -> int:
        rows = groups.rows(gpu_ok[groups.gpu] & market_ok[groups.market])
        mask = (book["gpu_count"][rows] >= 8) & ~book["interruptible"][rows]
        return int(rows[np.argmin(np.where(mask, book["price"][rows], np.inf))]) if len(rows) else -1

    return run


def floor_any(book: OfferBook) -> Callable[[], int]:
    """The reference for `gpu: any` ≥ 24 GB: one numpy pass over every row (every model is a candidate, so
    the index selects nothing) — memory, a GPU to be had — and the cheapest per GPU-hour."""
    mem, count, per_gpu = book["gpu_mem"], book["gpu_count"], book["price_per_gpu"]

    def run() -> int:
        return int(np.argmin(np.where((mem >= 24) & (count >= 1), per_gpu, np.inf)))

    return run


def load() -> str:
    return "load average " + " / ".join(f"{x:.1f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)"


def gpuhunt_query(offers: list[Offer]) -> tuple[Callable[[], Any], Callable[[], Any]] | None:
    """gpuhunt's Catalog.query over the same offers (as one offline catalog), when gpuhunt is installed."""
    try:
        from gpuhunt import AcceleratorVendor, Catalog, CatalogItem
        from gpuhunt._internal.catalog import ProviderCatalog
    except ImportError:
        return None
    items = sorted((CatalogItem(
        provider="aws", instance_name=o.sku, location=o.locality.zone or o.locality.region, price=o.usd_per_hour,
        cpu=o.vcpus, memory=o.ram_gb, gpu_count=o.gpu_count, gpu_name=o.gpu.split("-")[0],
        gpu_memory=o.gpu_memory_gb, spot=o.interruptible, disk_size=o.disk_gb,
        gpu_vendor=AcceleratorVendor.AMD if o.gpu.startswith("MI") else AcceleratorVendor.NVIDIA) for o in offers),
        key=lambda i: i.price)
    catalog = Catalog(balance_resources=False, auto_reload=False)
    catalog.catalog["aws"] = ProviderCatalog(version="bench", items=items)
    catalog.loaded_at = time.monotonic()
    return (lambda: catalog.query(provider="aws", gpu_name="H100", min_gpu_count=8, spot=False),
            lambda: catalog.query(provider="aws", gpu_name="H100", min_gpu_count=8))


@dataclass
class Figure:
    label: str
    runs: list[float]  # per run: median ms

    @property
    def text(self) -> str:
        return f"min {min(self.runs):.3f} / median {statistics.median(self.runs):.3f} ms"


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median milliseconds of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure(named: dict[str, tuple[Callable[[], Any], int]], runs: int) -> dict[str, Figure]:
    """Each callable timed in every run, interleaved, after one warm-up call."""
    for fn, _ in named.values():
        fn()
    out = {k: Figure(k, []) for k in named}
    for _ in range(runs):
        for k, (fn, repeat) in named.items():
            out[k].runs.append(timed(fn, repeat))
    return out


def varied(book: OfferBook, specs: list[JobSpec], shown: int) -> Callable[[], list[float]]:
    """Quote every spec; returns the per-quote milliseconds (the run's median is what is reported)."""
    def run() -> list[float]:
        times = []
        for s in specs:
            start = time.perf_counter()
            quote(book, s, now=NOW, max_rejected=shown)
            times.append((time.perf_counter() - start) * 1000)
        return times
    return run


def varied_figures(book: OfferBook, specs: list[JobSpec], runs: int, shown: int) -> tuple[Figure, Figure, int]:
    varied(book, specs[:20], shown)()
    medians, p99s = [], []
    for _ in range(runs):
        times = sorted(varied(book, specs, shown)())
        medians.append(statistics.median(times))
        p99s.append(times[max(int(len(times) * 0.99) - 1, 0)])
    feasible = sum(bool(quote(book, s, now=NOW, max_rejected=0).options) for s in specs)
    return Figure("varied", medians), Figure("p99", p99s), feasible


def ratio(a: Figure, b: Figure) -> str:
    return f"{statistics.median(a.runs) / statistics.median(b.runs):.1f}×"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--offers", type=int, default=50_000)
    ap.add_argument("--big", type=int, default=1_000_000, help="offers in the large book (0: skip it)")
    ap.add_argument("--mid", type=int, default=200_000, help="offers in the middle book (0: skip it)")
    ap.add_argument("--jobs", type=int, default=1_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=200, help="calls per run for single-job figures")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-rejected", type=int, default=API_MAX_REJECTED,
                    help=f"rejections spelled out per quote (the API's default is {API_MAX_REJECTED})")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    shown = args.max_rejected

    t0 = time.perf_counter()
    offers = synthetic_book(args.offers, rng)
    t1 = time.perf_counter()
    book = OfferBook.build(offers)
    t2 = time.perf_counter()
    specs = job_specs(args.jobs, rng)
    h100, anyjob = parse_spec(H100X8), parse_spec(ANY)
    gc.collect()
    print(f"offers in book:              {len(book):,} in {len(book.groups):,} index groups "
          f"(generation {t1 - t0:.2f} s; OfferBook.build {t2 - t1:.2f} s, once per market refresh)")
    default = " (the API's default)" if shown == API_MAX_REJECTED else f" (the API's default is {API_MAX_REJECTED})"
    print(f"rejections written out:      {shown} per quote{default}; all counted")
    print(f"machine:                     {os.cpu_count()} CPUs, {load()} at the start")

    named: dict[str, tuple[Callable[[], Any], int]] = {
        "quote": (lambda: quote(book, h100, now=NOW, max_rejected=shown), args.repeat),
        "floor": (floor_h100x8(book), args.repeat),
        "any": (lambda: quote(book, anyjob, now=NOW, max_rejected=shown), args.repeat // 4 or 1),
        "floor_any": (floor_any(book), args.repeat // 4 or 1),
    }
    hunt = gpuhunt_query(offers)
    if hunt is not None:
        named["gpuhunt"] = (hunt[0], 5)
        named["gpuhunt_any"] = (hunt[1], 5)
    f = measure(named, args.runs)
    print(f"\n{len(book):,} offers, one core, min / median over {args.runs} runs of each run's median:")
    print(f"  quote 8 × H100 (top 10):   {f['quote'].text}")
    print(f"  numpy floor, same job:     {f['floor'].text}   quote / floor = {ratio(f['quote'], f['floor'])}"
          "  (target ≤ 5×; quote target ≤ 0.5 ms)")
    if hunt is not None:
        print(f"  gpuhunt Catalog.query:     {f['gpuhunt'].text} on-demand, {f['gpuhunt_any'].text} any market;"
              f"  gpuhunt / quote = {ratio(f['gpuhunt'], f['quote'])}")
    else:
        print("  gpuhunt Catalog.query:     not measured (pip install gpuhunt)")
    print(f"  `gpu: any` ≥ 24 GB, 1 GPU: {f['any'].text}   numpy floor (every row) {f['floor_any'].text}"
          f"   quote / floor = {ratio(f['any'], f['floor_any'])}")
    med, p99, feasible = varied_figures(book, specs, args.runs, shown)
    print(f"  {len(specs):,} varied jobs:         median {med.text}; p99 {p99.text} ({feasible} with options)")
    print(f"  offers evaluated per second: {len(book) / (statistics.median(med.runs) / 1000):,.0f} (varied, median)")
    del offers, named, hunt
    gc.collect()

    for size in (args.mid, args.big):
        if size:
            big_book(book, size, args, h100, anyjob, specs, shown)
    print(f"\n{load()} at the end")


def big_book(book: OfferBook, size: int, args: argparse.Namespace, h100: JobSpec, anyjob: JobSpec,
             specs: list[JobSpec], shown: int) -> None:
    t0 = time.perf_counter()
    big = grow(book, size, np.random.default_rng(args.seed))
    t1 = time.perf_counter()
    view = big.pruned()  # what the first `gpu: any` quote on a new book version pays, once
    t2 = time.perf_counter()
    per_offer = big.nbytes() / len(big)
    print(f"\n{len(big):,} offers from columns (no Offer objects; built in {t1 - t0:.1f} s), "
          f"{per_offer:,.0f} bytes per offer in the book (target ≤ 1,024); folded by shape into "
          f"{len(view.reps):,} classes in {t2 - t1:.2f} s (once per book version):")
    fb = measure({
        "quote": (lambda: quote(big, h100, now=NOW, max_rejected=shown), max(args.repeat // 10, 3)),
        "floor": (floor_h100x8(big), max(args.repeat // 10, 3)),
        "any": (lambda: quote(big, anyjob, now=NOW, max_rejected=shown), 5),
        "any_plain": (lambda: quote_parts(big, anyjob, now=NOW, max_rejected=shown, prune=False), 3),
        "floor_any": (floor_any(big), 3),
    }, args.runs)
    target = "≤ 10 ms" if len(big) >= 1_000_000 else "≤ 3 ms at 200,000" if len(big) >= 200_000 else "—"
    print(f"  quote 8 × H100:            {fb['quote'].text}   (target ≤ 10 ms)")
    print(f"  numpy floor, same job:     {fb['floor'].text}   quote / floor = {ratio(fb['quote'], fb['floor'])}")
    print(f"  `gpu: any` ≥ 24 GB:        {fb['any'].text}   (target {target})")
    print(f"    the plain pass, no pruning: {fb['any_plain'].text}   plain / pruned = "
          f"{ratio(fb['any_plain'], fb['any'])}")
    print(f"    numpy floor (every row):    {fb['floor_any'].text}   quote / floor = "
          f"{ratio(fb['any'], fb['floor_any'])}")
    bmed, bp99, _ = varied_figures(big, specs[: max(len(specs) // 10, 10)], args.runs, shown)
    print(f"  {max(len(specs) // 10, 10):,} varied jobs:          median {bmed.text}; p99 {bp99.text}")
    print(f"  ({load()})")

if __name__ == "__main__":
    main()
