"""Ranking: order feasible offers by the expected cost of the *job*, not the sticker price.

expected cost = job $/h × (compute + communication + data transfer + preemption
losses) + data egress. A cheap GPU behind a slow fabric, or far from the data,
loses to a dearer one that finishes sooner. Pure: the current time is an
argument, never read from a clock, so the same code replays in a simulator.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np

from broker.models import CostBreakdown, JobSpec, Quote, QuoteOption, Rejection
from broker.perf import job_hours, preemption_overhead, step_shape, transfer_hours
from policies.book import OfferBook
from policies.constraints import CHECKS, CODE_OF, describe, job_node_price, reject_codes

# USD per GB leaving each source (internet egress list prices); same region is free.
EGRESS_USD_PER_GB: dict[str, float] = {"aws": 0.09, "gcp": 0.12, "azure": 0.087}
CROSS_REGION_USD_PER_GB = 0.02  # within one cloud


def parse_location(location: str) -> tuple[str, str]:
    """'aws:us-east-1' → ('aws', 'us-east-1'); 'onprem' → ('slurm', '')."""
    if not location:
        return "", ""
    provider, _, region = location.partition(":")
    provider = provider.strip().lower()
    if provider in ("onprem", "on-prem", "owned"):
        provider = "slurm"
    return provider, region.strip()


def _data_costs(book: OfferBook, spec: JobSpec, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(egress USD, transfer hours) for moving the job's data to each offer in ``idx``."""
    size = spec.data.size_gb
    src_provider, src_region = parse_location(spec.data.location)
    zeros = np.zeros(len(idx))
    if not size or not src_provider:
        return zeros, zeros
    prov_code = book.providers.index.get(src_provider, -1)
    reg_code = book.regions.index.get(src_region, -1) if src_region else -1
    same_provider = book["provider"][idx] == prov_code
    same_region = same_provider & ((book["region"][idx] == reg_code) | (not src_region))
    rate = np.full(len(idx), EGRESS_USD_PER_GB.get(src_provider, 0.0))
    cross_region = CROSS_REGION_USD_PER_GB if src_provider in EGRESS_USD_PER_GB else 0.0
    rate = np.where(same_provider, cross_region, rate)
    rate = np.where(same_region, 0.0, rate)
    hours = np.where(same_region, 0.0, transfer_hours(size, book["download_gbps"][idx]))
    return size * rate, hours


def quote(
    book: OfferBook,
    spec: JobSpec,
    *,
    now: datetime,
    top: int = 10,
    max_rejected: int | None = None,
) -> Quote:
    """Rank ``book`` for ``spec``. ``max_rejected`` caps how many rejections are spelled out
    (all of them are counted in ``rejected_counts``)."""
    codes = reject_codes(book, spec)
    idx = np.flatnonzero(codes == 0)
    nodes, gpn = spec.nodes, spec.gpus_per_node
    assert gpn is not None

    shape = step_shape(spec.workload)
    comp, comm = job_hours(
        shape, nodes=nodes, gpus_per_node=gpn, tflops_per_gpu=book["tflops"][idx],
        fabric_gbits=book["fabric_gbps"][idx], fabric_eff=book["fabric_eff"][idx],
        fabric_latency_us=book["fabric_lat"][idx], intra_busbw_gbps=book["intra_bw"][idx],
    )
    egress_usd, xfer = _data_costs(book, spec, idx)
    run = np.asarray(comp + comm + xfer, dtype=float)
    lost = preemption_overhead(run, book["preempt_rate"][idx], spec.checkpoint_minutes)
    lost = np.asarray(lost, dtype=float)
    billed_hours = run + lost
    job_price = job_node_price(book, spec, idx) * nodes
    cost = job_price * billed_hours + egress_usd
    wall = billed_hours + book["queue"][idx]

    late = np.zeros(len(idx), dtype=bool)
    deadline = spec.deadline_at(now)
    if deadline is not None:
        late = wall > (deadline - now).total_seconds() / 3600.0
        codes[idx[late]] = CODE_OF["deadline"]
    if spec.max_total_usd is not None:
        over = (cost > spec.max_total_usd) & ~late
        codes[idx[over]] = CODE_OF["budget"]
        late |= over
    keep = ~late
    idx, cost, wall, billed_hours = idx[keep], cost[keep], wall[keep], billed_hours[keep]
    comp, comm, xfer, lost = (np.broadcast_to(a, keep.shape)[keep] for a in (comp, comm, xfer, lost))
    egress_usd, job_price = egress_usd[keep], job_price[keep]

    if len(idx) > top:  # only the top few need a full sort
        head = np.argpartition(cost, top - 1)[:top]
        cutoff = cost[head].max()
        head = np.flatnonzero(cost <= cutoff)  # keep ties at the cut so the order stays stable
    else:
        head = np.arange(len(idx))
    sub = np.lexsort((wall[head], book["stale"][idx[head]], np.round(cost[head], 2)))
    order = head[sub][:top]
    options = []
    for j in order:
        i = int(idx[j])
        o = book.offers[i]
        notes = []
        if book["measured"][i]:
            source = o.perf.source if o.perf else ""
            notes.append(f"measured {book['tflops'][i]:.0f} TFLOP/s per GPU ({source})")
        elif o.perf is not None and o.perf.source == "dlperf":
            notes.append(f"speed prior from dlperf: {book['tflops'][i]:.0f} TFLOP/s per GPU")
        if o.stale:
            notes.append("offer is stale: its provider did not answer the last refresh")
        options.append(QuoteOption(
            offer_id=o.id, provider=o.provider, market=o.market, sku=o.sku, region=o.locality.region,
            zone=o.locality.zone, cluster=o.locality.cluster, nodes=nodes, gpus_per_node=gpn, gpu=o.gpu,
            fabric=o.network.fabric, fabric_gbps=o.network.fabric_gbps,
            usd_per_hour=round(float(job_price[j]), 4), expected_hours=round(float(wall[j]), 4),
            expected_cost_usd=round(float(cost[j]), 2), interruptible=o.interruptible, stale=o.stale,
            perf_source=(o.perf.source if o.perf else "datasheet"),
            breakdown=CostBreakdown(
                compute_hours=round(float(comp[j]), 4), comm_hours=round(float(comm[j]), 4),
                queue_wait_hours=round(float(book["queue"][i]), 4),
                preemption_overhead_hours=round(float(lost[j]), 4),
                egress_usd=round(float(egress_usd[j]), 2),
                compute_usd=round(float(job_price[j] * billed_hours[j]), 2), notes=notes,
            ),
        ))

    rejected_idx = np.flatnonzero(codes)
    counts: dict[str, int] = {}
    if len(rejected_idx):
        freq = np.bincount(codes, minlength=len(CHECKS) + 1)
        counts = {CHECKS[v - 1].code: int(freq[v]) for v in range(1, len(freq)) if freq[v]}
    shown = rejected_idx if max_rejected is None else rejected_idx[:max_rejected]
    rejected = []
    for i in shown:
        o = book.offers[int(i)]
        code, reason = describe(int(codes[i]), o, spec)
        rejected.append(Rejection(provider=o.provider, sku=o.sku, region=o.locality.region,
                                  zone=o.locality.zone, offer_id=o.id, code=code, reason=reason))
    return Quote(job=spec, options=options, rejected=rejected, rejected_counts=counts,
                 offers_considered=len(book), at=now)
