"""Ranking: order feasible offers by the expected cost of the *job*, not the sticker price.

expected cost = job $/h × (compute + communication + data transfer + preemption
losses) + data egress. A cheap GPU behind a slow fabric, or far from the data,
loses to a dearer one that finishes sooner. Pure: the current time is an
argument, never read from a clock, so the same code replays in a simulator.

One pass over the columns of the rows the index selects (policies/constraints.py);
only the options shown and the rejections written out become objects.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

import numpy as np

from broker.models import NO_WORKLOAD_NOTE, JobSpec, Quote, QuoteOption, source_label_at
from broker.perf import job_hours, preemption_overhead, step_shape, transfer_hours
from policies.assembly import assemblable, assemble
from policies.book import FABRICS, MARKETS, OWNED, SOURCES, OfferBook
from policies.constraints import CODE_OF, Screen, describe, job_node_price, screen

# Moving data out of a site whose offers declare no egress price (a cloud region's internet
# egress list price is $0.05-0.12/GB; $0.09 is the common first tier). Owned sites: your own uplink.
DEFAULT_EGRESS_USD_PER_GB = 0.09
CROSS_REGION_USD_PER_GB = 0.02  # between regions of one site, when its egress costs more
ONPREM = "onprem"  # a data location in the owned market (on-prem hardware), whatever its provider
_ONPREM_ALIASES = frozenset({"onprem", "on-prem", "owned"})


def parse_location(location: str) -> tuple[str, str]:
    """'aws:us-east-1' → ('aws', 'us-east-1'): the site offers name in their locality, and a region.
    'onprem' (or 'on-prem', 'owned', optionally ':REGION') → (ONPREM, region): the owned market."""
    if not location:
        return "", ""
    site, _, region = location.partition(":")
    site = site.strip().lower()
    if site in _ONPREM_ALIASES:
        site = ONPREM
    return site, region.strip()


def _data_costs(book: OfferBook, spec: JobSpec, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(egress USD, transfer hours) for moving the job's data to each offer in ``idx``.

    Same site and region: free. Same site, another region: the cross-region rate (at most the
    site's egress). Elsewhere: the site's egress rate — the spec's, else the highest its own
    offers declare, else the default — and the time to download it over the offer's link.
    """
    size = spec.data.size_gb
    site, region = parse_location(spec.data.location)
    zeros = np.zeros(len(idx))
    if not size or not site:
        return zeros, zeros
    if site == ONPREM:
        same_site = book["market"][idx] == OWNED
        declared = book.owned_egress
    else:
        code = book.sites.index.get(site, -1)
        same_site = book["site"][idx] == code
        declared = float(book.site_egress[code]) if code >= 0 else 0.0
        declared = declared or DEFAULT_EGRESS_USD_PER_GB
    rate = spec.data.egress_usd_per_gb if spec.data.egress_usd_per_gb is not None else declared
    if region:
        same_region = same_site & (book["region"][idx] == book.regions.index.get(region, -1))
    else:
        same_region = same_site
    per_gb = np.where(same_region, 0.0, np.where(same_site, min(rate, CROSS_REGION_USD_PER_GB), rate))
    hours = np.where(same_region, 0.0, transfer_hours(size, book["download_gbps"][idx]))
    return size * per_gb, hours


def _missing_models(book: OfferBook, spec: JobSpec) -> list[str]:
    """Models the job accepts that no offer in the book is of."""
    return [m for m in spec.gpu if book.gpu_code(m) is None]


def quote(
    book: OfferBook,
    spec: JobSpec,
    *,
    now: datetime,
    top: int = 10,
    max_rejected: int | None = None,
    exclude: Collection[str] = (),
) -> Quote:
    """Rank ``book`` for ``spec``. ``max_rejected`` caps how many rejections are spelled out
    (all of them are counted in ``rejected_counts``).

    A multi-node job that may run on scattered machines also gets the options assembled from the single
    machines of ``book.assemblers`` (policies/assembly.py), ranked by the same model; ``exclude``: offer ids
    of machines that are taken, which no assembly may use."""
    q = _quote(book, spec, now=now, top=top, max_rejected=max_rejected)
    if not (book.assemblers and assemblable(spec)):
        return q
    extra = assemble(book, spec, exclude=exclude)
    if extra is None:
        return q
    aq = _quote(extra, spec, now=now, top=top, max_rejected=0)
    note = f"assembled from {spec.nodes} separately rented machines: ethernet over the internet between them"
    assembled = [o.model_copy(update={"breakdown": o.breakdown.model_copy(
        update={"notes": [*o.breakdown.notes, note]})}) if o.breakdown else o for o in aq.options]
    options = sorted([*q.options, *assembled], key=lambda o: (o.expected_cost_usd, o.stale, o.expected_hours or 0.0))
    counts = dict(q.rejected_counts)
    for code, count in aq.rejected_counts.items():
        counts[f"{code} (assembled)"] = counts.get(f"{code} (assembled)", 0) + count
    return q.model_copy(update={"options": options[:top], "rejected_counts": counts,
                                "notes": [*q.notes, f"{len(extra)} option(s) assembled from single machines"]})


def _quote(
    book: OfferBook,
    spec: JobSpec,
    *,
    now: datetime,
    top: int,
    max_rejected: int | None,
) -> Quote:
    sc = screen(book, spec)
    pos = np.flatnonzero(sc.codes == 0)  # feasible, as positions among the screened rows
    idx = sc.rows[pos]
    nodes, gpn = spec.nodes, spec.gpus_per_node
    assert gpn is not None

    def take(name: str, unused: float | None = None) -> np.ndarray | float:
        """The column's values for the feasible rows; a constant where the job's shape makes them irrelevant."""
        return book[name][idx] if unused is None else unused

    if spec.workload is None:  # nothing to size: rank by the shape's $/h, the hours unknown
        return _per_hour_quote(book, spec, sc, pos, now=now, top=top, max_rejected=max_rejected)
    # Gather only the columns this job's formulas read (one node: no fabric; one GPU: no NVLink either).
    shape = step_shape(spec.workload)
    comm = shape.total_flops > 0 and shape.grad_bytes > 0 and shape.steps > 0
    inter, intra = None if comm and nodes > 1 else 0.0, None if comm and gpn > 1 else 1.0
    comp, comm_h = job_hours(
        shape, nodes=nodes, gpus_per_node=gpn, tflops_per_gpu=take("tflops", None if shape.total_flops > 0 else 1.0),
        fabric_gbits=take("fabric_gbps", inter), fabric_eff=take("fabric_eff", inter),
        fabric_latency_us=take("fabric_lat", inter), intra_busbw_gbps=take("intra_bw", intra),
    )
    egress_usd, xfer = _data_costs(book, spec, idx)
    run = np.asarray(comp + comm_h + xfer, dtype=float)
    if spec.interruptible:  # otherwise no interruptible offer got this far: nothing is lost to preemption
        lost = np.asarray(preemption_overhead(run, book["preempt_rate"][idx], spec.checkpoint_minutes), dtype=float)
    else:
        lost = np.zeros(len(idx))
    billed_hours = run + lost
    job_price = job_node_price(book, spec, idx) * nodes
    cost = job_price * billed_hours + egress_usd
    wall = billed_hours + book["queue"][idx] if book.any_queue else billed_hours

    late = np.zeros(len(idx), dtype=bool)
    deadline = spec.deadline_at(now)
    late_onprem: list[dict[str, Any]] = []
    if deadline is not None:
        late = wall > (deadline - now).total_seconds() / 3600.0
        sc.codes[pos[late]] = CODE_OF["deadline"]
        # The cheapest on-prem option the deadline rejected: the placement's burst reason quotes its wait and cost.
        owned_late = np.flatnonzero(late & (book["market"][idx] == OWNED))
        if len(owned_late):
            j = owned_late[np.argmin(cost[owned_late])][None]
            late_onprem = _options(book, idx[j], nodes, gpn, now, price=job_price[j], wall=wall[j], cost=cost[j],
                                   comp=np.broadcast_to(comp, cost.shape)[j],
                                   comm=np.broadcast_to(comm_h, cost.shape)[j], lost=lost[j], egress=egress_usd[j],
                                   billed=billed_hours[j])
    if spec.max_total_usd is not None:
        over = (cost > spec.max_total_usd) & ~late
        sc.codes[pos[over]] = CODE_OF["budget"]
        late |= over
    keep = np.flatnonzero(~late)

    costs = cost[keep]
    if len(keep) > top:  # only the top few need a full sort
        head = np.argpartition(costs, top - 1)[:top]
        head = np.flatnonzero(costs <= costs[head].max())  # keep ties at the cut so the order stays stable
    else:
        head = np.arange(len(keep))
    chosen = keep[head]
    # Cheapest to the cent first; then fresh before stale, sooner before later, and the exact cost.
    sub = np.lexsort((cost[chosen], wall[chosen], book["stale"][idx[chosen]], np.round(cost[chosen], 2)))
    shown = chosen[sub][:top]
    options = _options(book, idx[shown], nodes, gpn, now, price=job_price[shown], wall=wall[shown], cost=cost[shown],
                       comp=np.broadcast_to(comp, cost.shape)[shown], comm=np.broadcast_to(comm_h, cost.shape)[shown],
                       lost=lost[shown], egress=egress_usd[shown], billed=billed_hours[shown])
    q = _answer(book, spec, sc, idx[keep], options, now=now, max_rejected=max_rejected)
    if late_onprem:
        q.late_onprem = QuoteOption.model_validate(late_onprem[0])
    return q


def _per_hour_quote(book: OfferBook, spec: JobSpec, sc: Screen, pos: np.ndarray, *, now: datetime, top: int,
                    max_rejected: int | None) -> Quote:
    """A spec without a workload: the feasible offers (the same screen) by the job's price per hour."""
    idx = sc.rows[pos]
    nodes, gpn = spec.nodes, spec.gpus_per_node
    assert gpn is not None
    price = job_node_price(book, spec, idx) * nodes
    egress_usd, _ = _data_costs(book, spec, idx)
    zeros, ones = np.zeros(len(idx)), np.ones(len(idx))
    queue = book["queue"][idx] if book.any_queue else zeros
    order = np.lexsort((queue, book["stale"][idx], np.round(price, 2)))[:top]
    options = _options(book, idx[order], nodes, gpn, now, price=price[order], wall=queue[order],
                       cost=price[order], comp=zeros[order], comm=zeros[order], lost=zeros[order],
                       egress=egress_usd[order], billed=ones[order])
    for o in options:
        o["expected_hours"] = None
    q = _answer(book, spec, sc, idx, options, now=now, max_rejected=max_rejected)
    return q.model_copy(update={"notes": [NO_WORKLOAD_NOTE, *q.notes]})


def _answer(book: OfferBook, spec: JobSpec, sc: Screen, feasible: np.ndarray, options: list[dict[str, Any]], *,
            now: datetime, max_rejected: int | None) -> Quote:
    """The quote: the options shown, the rejections spelled out and counted, the feasible rows by source."""
    rows, codes = sc.rejected(max_rejected)
    text = {k: book.texts(k, rows) for k in ("provider", "sku", "region", "zone")}
    rejected = []
    for j, (i, c) in enumerate(zip(rows.tolist(), codes.tolist(), strict=True)):
        code, reason = describe(c, book.row(i), spec)
        rejected.append({"provider": text["provider"][j], "sku": text["sku"][j], "region": text["region"][j],
                         "zone": text["zone"][j], "offer_id": book.ids[i], "code": code, "reason": reason})
    missing = _missing_models(book, spec)
    by_source = _by_source(book, feasible)
    # One validation call for the whole answer (per-object constructors cost 3-10× more).
    return Quote.model_validate({
        "job": spec, "options": options, "rejected": rejected, "rejected_counts": sc.counts(),
        "offers_considered": len(book), "at": now, "feasible_sources": by_source,
        "notes": [f"no market offers {', '.join(missing)}"] if missing else [],
    })


def _by_source(book: OfferBook, rows: np.ndarray) -> dict[str, dict[str, int]]:
    """Feasible rows per market (``provider``) and price source: {"aws": {"live": 12, "snapshot": 3}}."""
    if not len(rows):
        return {}
    names = book.providers.names
    key = book["provider"][rows] * len(SOURCES) + book["source"][rows]  # int32: one pass, no sort
    counts = np.bincount(key, minlength=len(names) * len(SOURCES))
    out: dict[str, dict[str, int]] = {}
    for k in np.flatnonzero(counts).tolist():
        out.setdefault(names[k // len(SOURCES)], {})[SOURCES[k % len(SOURCES)].value] = int(counts[k])
    return out


def _options(book: OfferBook, rows: np.ndarray, nodes: int, gpn: int, now: datetime,
             **figures: np.ndarray) -> list[dict[str, Any]]:
    """The options shown, as data for QuoteOption: only these rows become objects."""
    c = book.cols
    f = {k: v.tolist() for k, v in figures.items()}
    text = {k: book.texts(k, rows) for k in ("provider", "sku", "region", "zone", "cluster", "gpu", "perf_source")}
    num = {k: c[k][rows].tolist() for k in ("market", "fabric", "fabric_gbps", "interruptible", "stale", "queue",
                                             "measured", "tflops", "source", "observed_at")}
    now_ts = now.timestamp()
    out = []
    for j, i in enumerate(rows.tolist()):
        perf_source, tflops = text["perf_source"][j], num["tflops"][j]
        notes = []
        if num["measured"][j]:
            notes.append(f"measured {tflops:.0f} TFLOP/s per GPU ({perf_source})")
        elif perf_source == "dlperf":
            notes.append(f"speed prior from dlperf: {tflops:.0f} TFLOP/s per GPU")
        source, observed_ts = SOURCES[num["source"][j]], num["observed_at"][j]
        age = now_ts - observed_ts
        label = source_label_at(source, observed_ts, age)
        if num["stale"][j]:
            notes.append("offer is stale: its provider did not answer the last refresh")
        if source.value != "live":
            notes.append(f"price: {label}")
        out.append({
            "offer_id": book.ids[i], "provider": text["provider"][j], "market": MARKETS[num["market"][j]],
            "sku": text["sku"][j], "region": text["region"][j], "zone": text["zone"][j],
            "cluster": text["cluster"][j], "nodes": nodes, "gpus_per_node": gpn, "gpu": text["gpu"][j],
            "fabric": FABRICS[num["fabric"][j]], "fabric_gbps": num["fabric_gbps"][j],
            "usd_per_hour": round(f["price"][j], 4), "expected_hours": round(f["wall"][j], 4),
            "expected_cost_usd": round(f["cost"][j], 2), "interruptible": num["interruptible"][j],
            "stale": num["stale"][j], "perf_source": perf_source, "source": source,
            "observed_at": datetime.fromtimestamp(observed_ts, UTC), "age_s": round(age, 1), "source_label": label,
            "breakdown": {
                "compute_hours": round(f["comp"][j], 4), "comm_hours": round(f["comm"][j], 4),
                "queue_wait_hours": round(num["queue"][j], 4), "preemption_overhead_hours": round(f["lost"][j], 4),
                "egress_usd": round(f["egress"][j], 2), "compute_usd": round(f["price"][j] * f["billed"][j], 2),
                "notes": notes,
            },
        })
    return out
