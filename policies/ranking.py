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
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson

from broker.gpus import GPU_SPECS
from broker.models import NO_WORKLOAD_NOTE, JobSpec, OfferSource, Quote, source_label_at
from broker.perf import job_hours, preemption_overhead, step_shape, transfer_hours
from policies.assembly import assemblable, assemble
from policies.book import FABRICS, MARKETS, OWNED, PRUNE_MIN_ROWS, SOURCES, OfferBook
from policies.constraints import CHECKS, CODE_OF, Screen, describe, group_checks, job_node_price, screen

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


def _missing_models(book: OfferBook, spec: JobSpec) -> tuple[str, ...]:
    """Models the job accepts that no offer in the book is of, leaving out a family's members when another
    member it accepts is offered: `gpu: H100` expands to three models, and "no market offers H100-NVL"
    before the real answer is noise (issue 29). Worked out once per GPU list on a book (it reads only the
    book's GPU names, which every version of a book shares)."""
    key = tuple(spec.gpu)
    memo = book._missing_memo
    missing = memo.get(key)
    if missing is None:
        absent = [m for m in key if book.gpu_code(m) is None]
        offered_families = {GPU_SPECS[m].family for m in key if m not in absent and m in GPU_SPECS}
        missing = tuple(m for m in absent if m not in GPU_SPECS or GPU_SPECS[m].family not in offered_families)
        if len(memo) >= MISSING_MEMO_SIZE:
            memo.clear()
        memo[key] = missing
    return missing


MISSING_MEMO_SIZE = 256  # GPU lists remembered per book


# The pruned path (PrunedView, policies/book.py) pays off only on a large book (PRUNE_MIN_ROWS offers, and
# as many candidate rows after the job's group checks) that folds to at most this share of its rows.
PRUNE_MAX_SHARE = 0.5


@dataclass
class QuoteParts:
    """A quote as plain data, built once from the book's columns: every value comes from the book or from the
    code here, already of its field's type. :meth:`json` gives the API's text straight from these values,
    with no model made or validated (orjson: the same bytes pydantic writes, at a fraction of the cost);
    :meth:`model` gives the :class:`Quote` Python callers (the router, the CLI) use."""

    job: JobSpec
    options: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    rejected_counts: dict[str, int]
    notes: list[str]
    offers_considered: int
    feasible_sources: dict[str, dict[str, int]]
    at: datetime
    late_onprem: dict[str, Any] | None = None

    def model(self) -> Quote:
        # One call into pydantic-core for the whole answer: measured 2-3× faster than model_construct of
        # the nested options (model_construct runs in Python, field by field, per object).
        return Quote.model_validate({
            "job": self.job, "options": self.options, "rejected": self.rejected,
            "rejected_counts": self.rejected_counts, "notes": self.notes, "offers_considered": self.offers_considered,
            "late_onprem": self.late_onprem, "feasible_sources": self.feasible_sources, "at": self.at})

    def json(self, job_json: str | None = None) -> str:
        """The answer as JSON text, fields in the model's order; ``job_json``: the spec's own JSON when the
        caller has it already (the API keys its reuse of answers by it)."""
        rest = orjson.dumps({
            "options": self.options, "rejected": self.rejected, "rejected_counts": self.rejected_counts,
            "notes": self.notes, "offers_considered": self.offers_considered, "late_onprem": self.late_onprem,
            "feasible_sources": self.feasible_sources, "at": self.at,
        }, option=orjson.OPT_UTC_Z).decode()
        job = self.job.model_dump_json() if job_json is None else job_json
        return '{"job":' + job + "," + rest[1:]


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
    return quote_parts(book, spec, now=now, top=top, max_rejected=max_rejected, exclude=exclude).model()


def quote_parts(
    book: OfferBook,
    spec: JobSpec,
    *,
    now: datetime,
    top: int = 10,
    max_rejected: int | None = None,
    exclude: Collection[str] = (),
    prune: bool | None = None,
) -> QuoteParts:
    """:func:`quote` as :class:`QuoteParts` (what the API serialises without making models). ``prune``:
    rank through the book folded by shape (PrunedView) whenever that is exact (True), never (False), or
    when it is exact and pays (None: a large book with many candidate rows)."""
    q = _quote(book, spec, now=now, top=top, max_rejected=max_rejected, prune=prune)
    if not (book.assemblers and assemblable(spec)):
        return q
    extra = assemble(book, spec, exclude=exclude)
    if extra is None:
        return q
    aq = _quote(extra, spec, now=now, top=top, max_rejected=0)
    note = f"assembled from {spec.nodes} separately rented machines: ethernet over the internet between them"
    assembled = [{**o, "breakdown": {**o["breakdown"], "notes": [*o["breakdown"]["notes"], note]}}
                 for o in aq.options]
    options = sorted([*q.options, *assembled],
                     key=lambda o: (o["expected_cost_usd"], o["stale"], o["expected_hours"] or 0.0))
    counts = dict(q.rejected_counts)
    for code, count in aq.rejected_counts.items():
        counts[f"{code} (assembled)"] = counts.get(f"{code} (assembled)", 0) + count
    q.options, q.rejected_counts = options[:top], counts
    q.notes = [*q.notes, f"{len(extra)} option(s) assembled from single machines"]
    return q


@dataclass
class _Ranked:
    """One pass of the constraints and the cost model over a book."""

    sc: Screen
    idx: np.ndarray  # feasible rows after the screen (book rows)
    pos: np.ndarray  # their positions among ``sc.rows``
    keep: np.ndarray  # positions in ``idx`` that meet the deadline and the budget too
    shown: np.ndarray  # positions in ``idx`` of the options, best first
    figures: dict[str, np.ndarray]  # per shown option
    late_onprem: dict[str, Any] | None = None  # the cheapest on-prem option the deadline rejected


def _rank(book: OfferBook, spec: JobSpec, now: datetime, top: int) -> _Ranked:
    sc = screen(book, spec)
    # ``nonzero()[0]`` of a 1-D array is ``np.flatnonzero``'s answer without its Python layer (~1 µs a call).
    pos = (sc.codes == 0).nonzero()[0]  # feasible, as positions among the screened rows
    idx = sc.rows[pos]
    nodes, gpn = spec.nodes, spec.gpus_per_node
    assert gpn is not None

    def take(name: str, unused: float | None = None) -> np.ndarray | float:
        """The column's values for the feasible rows; a constant where the job's shape makes them irrelevant."""
        return book[name][idx] if unused is None else unused

    assert spec.workload is not None  # _quote ranks a spec without one by $/h (_per_hour_quote)
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
    late_onprem = None
    if deadline is not None:
        late = wall > (deadline - now).total_seconds() / 3600.0
        sc.codes[pos[late]] = CODE_OF["deadline"]
        # The cheapest on-prem option the deadline rejected: the placement's burst reason quotes its wait and cost.
        owned_late = np.flatnonzero(late & (book["market"][idx] == OWNED))
        if len(owned_late):
            j = owned_late[np.argmin(cost[owned_late])][None]
            late_onprem = _options(book, idx[j], nodes, gpn, now, price=job_price[j], wall=wall[j], cost=cost[j],
                                   comp=_pick(comp, j), comm=_pick(comm_h, j), lost=lost[j], egress=egress_usd[j],
                                   billed=billed_hours[j])[0]
    if spec.max_total_usd is not None:
        over = (cost > spec.max_total_usd) & ~late
        sc.codes[pos[over]] = CODE_OF["budget"]
        late |= over
    # No deadline and no budget: every feasible row is kept (what flatnonzero would give, two calls fewer).
    keep = (~late).nonzero()[0] if deadline is not None or spec.max_total_usd is not None else np.arange(len(idx))

    # The order: cheapest to the cent first; then fresh before stale, sooner before later, the exact cost,
    # the lower price, the book row. Only the rows that can be among the first ``top`` are sorted: those
    # whose cost to the cent is at most the top-th lowest's (every tie at the cut kept).
    costs = cost[keep]
    if len(keep) > top:
        # The top-th lowest cost (the value is the same whichever way it is found: an in-place partition of a
        # copy skips np.argpartition's Python layer), to the cent.
        kth = costs.copy()
        kth.partition(top - 1)
        cut = float(_cents(kth[top - 1]))
        near = (costs <= cut + 0.01).nonzero()[0]  # a superset: rounding moves a cost by at most half a cent
        head = near[_cents(costs[near]) <= cut]
    else:
        head = np.arange(len(keep))
    chosen = keep[head]  # ascending, so the stable sort leaves equal keys in book order
    rows = idx[chosen]
    sub = np.lexsort((book["price"][rows], cost[chosen], wall[chosen], book["stale"][rows], _cents(cost[chosen])))
    shown = chosen[sub][:top]
    figures = {"price": job_price[shown], "wall": wall[shown], "cost": cost[shown],
               "comp": _pick(comp, shown), "comm": _pick(comm_h, shown),
               "lost": lost[shown], "egress": egress_usd[shown], "billed": billed_hours[shown]}
    return _Ranked(sc, idx, pos, keep, shown, figures, late_onprem)


def _cents(values: Any) -> Any:
    """``np.round(values, 2)``, bit for bit: numpy rounds to decimals by multiplying by 10**decimals, ``rint``
    and dividing back, and so does this, without ``np.round``'s Python-level dispatch (a few µs a call, three
    calls a quote)."""
    return np.rint(values * 100.0) / 100.0


def _pick(values: np.ndarray | float, shown: np.ndarray) -> np.ndarray:
    """``values`` at ``shown``: a column of the feasible rows, or one figure the same for all of them."""
    if isinstance(values, np.ndarray) and values.ndim:
        picked: np.ndarray = values[shown]
        return picked
    return np.full(len(shown), float(values))


def _exact_when_pruned(spec: JobSpec, max_rejected: int | None) -> bool:
    """Whether the pruned view answers this quote exactly: no rejection spelled out (those name single
    offers) and no check that depends on the price (a price cap or a budget splits a shape class)."""
    return max_rejected == 0 and spec.max_usd_per_hour is None and spec.max_total_usd is None


def _quote(
    book: OfferBook,
    spec: JobSpec,
    *,
    now: datetime,
    top: int,
    max_rejected: int | None,
    prune: bool | None = None,
) -> QuoteParts:
    if spec.workload is None:  # nothing to size: rank by the shape's $/h, the hours unknown
        return _per_hour_quote(book, spec, now=now, top=top, max_rejected=max_rejected)
    if prune is not False and _exact_when_pruned(spec, max_rejected):
        if prune:
            return _quote_pruned(book, spec, now=now, top=top)
        if len(book) >= PRUNE_MIN_ROWS:  # pays only with many candidate rows, on a book that folds well
            group_codes = group_checks(book, spec)
            candidates = int(book.groups.size[group_codes == 0].sum())
            if candidates >= PRUNE_MIN_ROWS and len(book.pruned().reps) <= PRUNE_MAX_SHARE * len(book):
                return _quote_pruned(book, spec, now=now, top=top)
    r = _rank(book, spec, now, top)
    idx, sc = r.idx, r.sc
    options = _options(book, idx[r.shown], spec.nodes, spec.gpus_per_node or 1, now, **r.figures)
    rejected = _rejections(book, spec, sc, max_rejected)
    return _parts(book, spec, now, options, rejected, sc.counts(), _by_source(book, idx[r.keep]), r.late_onprem)


def _parts(book: OfferBook, spec: JobSpec, now: datetime, options: list[dict[str, Any]],
           rejected: list[dict[str, Any]], counts: dict[str, int],
           by_source: dict[str, dict[str, int]], late_onprem: dict[str, Any] | None = None) -> QuoteParts:
    missing = _missing_models(book, spec)
    return QuoteParts(job=spec, options=options, rejected=rejected, rejected_counts=counts,
                      notes=[f"no market offers {', '.join(missing)}"] if missing else [],
                      offers_considered=len(book), feasible_sources=by_source, at=now, late_onprem=late_onprem)


def _rejections(book: OfferBook, spec: JobSpec, sc: Screen, max_rejected: int | None) -> list[dict[str, Any]]:
    """The rejections spelled out (``max_rejected`` at most), each with its offer and reason."""
    rows, codes = sc.rejected(max_rejected)
    rejected: list[dict[str, Any]] = []
    if len(rows):
        text = {k: book.texts(k, rows) for k in ("provider", "sku", "region", "zone")}
        for j, (i, c) in enumerate(zip(rows.tolist(), codes.tolist(), strict=True)):
            code, reason = describe(c, book.row(i), spec)
            rejected.append({"provider": text["provider"][j], "sku": text["sku"][j], "region": text["region"][j],
                             "zone": text["zone"][j], "offer_id": book.ids[i], "code": code, "reason": reason})
    return rejected


def _per_hour_quote(book: OfferBook, spec: JobSpec, *, now: datetime, top: int,
                    max_rejected: int | None) -> QuoteParts:
    """A spec without a workload: the feasible offers (the same screen) by the job's price per hour."""
    sc = screen(book, spec)
    idx = sc.rows[np.flatnonzero(sc.codes == 0)]
    nodes, gpn = spec.nodes, spec.gpus_per_node
    assert gpn is not None
    price = job_node_price(book, spec, idx) * nodes
    egress_usd, _ = _data_costs(book, spec, idx)
    zeros, ones = np.zeros(len(idx)), np.ones(len(idx))
    queue = book["queue"][idx] if book.any_queue else zeros
    order = np.lexsort((queue, book["stale"][idx], _cents(price)))[:top]
    options = _options(book, idx[order], nodes, gpn, now, price=price[order], wall=queue[order],
                       cost=price[order], comp=zeros[order], comm=zeros[order], lost=zeros[order],
                       egress=egress_usd[order], billed=ones[order])
    for o in options:
        o["expected_hours"] = None
    parts = _parts(book, spec, now, options, _rejections(book, spec, sc, max_rejected), sc.counts(),
                   _by_source(book, idx))
    parts.notes = [NO_WORKLOAD_NOTE, *parts.notes]
    return parts


def _quote_pruned(book: OfferBook, spec: JobSpec, *, now: datetime, top: int) -> QuoteParts:
    """The same answer as the plain pass, from the book folded by shape (PrunedView): rank one row per
    class, then rank again the first ``top`` offers of the classes of the ``top`` best; the counts are
    the classes' codes weighted by their sizes (no check here depends on the price, see _exact_when_pruned)."""
    view = book.pruned()
    reps = view.reps
    first = _rank(reps, spec, now, top)
    rows = view.first(first.idx[first.shown], top)
    r = _rank(book.subset(rows), spec, now, top) if len(rows) else None
    options = [] if r is None else _options(book, rows[r.idx[r.shown]], spec.nodes, spec.gpus_per_node or 1, now,
                                            **r.figures)
    codes = first.sc.all_codes()
    freq = np.bincount(codes, weights=view.size, minlength=len(CHECKS) + 1)
    counts = {CHECKS[v - 1].code: int(freq[v]) for v in range(1, len(freq)) if freq[v]}
    feasible = first.idx[first.keep]
    by_source = _by_source(reps, feasible, weights=view.size[feasible])
    return _parts(book, spec, now, options, [], counts, by_source, first.late_onprem)


def _by_source(book: OfferBook, rows: np.ndarray, weights: np.ndarray | None = None) -> dict[str, dict[str, int]]:
    """Feasible rows per market (``provider``) and price source: {"aws": {"live": 12, "snapshot": 3}};
    ``weights``: how many offers each row stands for (a shape class of the pruned view)."""
    if not len(rows):
        return {}
    names = book.providers.names
    key = book["provider"][rows] * len(SOURCES) + book["source"][rows]  # int32: one pass, no sort
    counts = np.bincount(key, weights=weights, minlength=len(names) * len(SOURCES))
    out: dict[str, dict[str, int]] = {}
    listed = counts.tolist()  # Python numbers at once, not a numpy scalar per market and source
    for k in counts.nonzero()[0].tolist():
        out.setdefault(names[k // len(SOURCES)], {})[_SOURCE_TEXT[k % len(SOURCES)]] = int(listed[k])
    return out


# Enum members' text, looked up once: an enum's ``.value`` is a Python-level property, and orjson reads it
# for every enum it writes (three per option).
_MARKET_TEXT = tuple(m.value for m in MARKETS)
_FABRIC_TEXT = tuple(f.value for f in FABRICS)
_SOURCE_TEXT = tuple(s.value for s in SOURCES)
_LIVE = OfferSource.live.value


def rounded(values: np.ndarray, digits: np.ndarray, scale: np.ndarray | None = None) -> list[list[float]]:
    """Per row ``k`` of the 2-D ``values``: ``[round(v, int(digits[k])) for v in values[k]]``, the same floats
    from one numpy pass (Python's ``round`` of a float costs ~0.3 µs, and an option has ten of them). Scaled
    by 10**digits and rounded by ``rint``, a value clear of a half (by more than the scaling's own error
    could move it) rounds as ``round`` rounds its exact value, and ``q / 10**digits`` (q an integer below
    2**52, one correctly rounded division) is the double nearest the rounded decimal: what ``round``
    returns. The few values near a half, huge or not finite are given to ``round`` itself. ``scale``:
    ``_scale(digits)`` when the caller has it already (the options' digits are always the same)."""
    if scale is None:
        scale = _scale(digits)
    with np.errstate(over="ignore", invalid="ignore"):  # huge or not finite: given to round below
        p = values * scale
        q = np.rint(p)
        out: list[list[float]] = (q / scale).tolist()
        # How far p is from a half: |p - q| <= 0.5 (q = rint(p)), so 0.5 - |p - q| is | |p - q| - 0.5 |
        # exactly. A value at or above 2**52 (or not finite) is never sure: its margin is under size * 2**-48.
        sure = 0.5 - np.abs(p - q) > np.abs(p) * 2.0 ** -48 + 2.0 ** -60
    if not sure.all():
        for k, j in zip(*np.nonzero(~sure), strict=True):
            out[k][j] = round(float(values[k, j]), int(digits[k]))
    return out


def _scale(digits: np.ndarray) -> np.ndarray:
    """Per row of :func:`rounded`'s values, 10**digits (a column)."""
    scale: np.ndarray = (10.0 ** digits.astype(np.float64))[:, None]
    return scale


# The figures of an option and their decimals, in the order :func:`_options` rounds them (one call).
_ROUNDED = ("price", "wall", "comp", "comm", "lost", "queue", "cost", "egress", "compute_usd", "age")
_DIGITS = np.array([4, 4, 4, 4, 4, 4, 2, 2, 2, 1])
_DIGITS_SCALE = _scale(_DIGITS)


# What an option shows of its offer that depends on neither the job nor the time, per book row (see
# :func:`_heads`): (offer_id, provider, market, sku, region, zone, cluster, gpu, fabric, fabric_gbps,
# interruptible, stale, perf_source, source kind and its text, observed_at as POSIX time and as a datetime,
# the notes that come before the price's).
_Head = tuple[str, str, str, str, str, str, str, str, str, float, bool, bool, str, OfferSource, str, float,
              datetime, tuple[str, ...]]
HEAD_MEMO_SIZE = 65_536  # rows remembered per book: a few hundred bytes each


def _heads(book: OfferBook, rows: list[int]) -> list[_Head]:
    """Per row, what :func:`_options` shows of the offer that no job and no clock changes, worked out once
    per book (kept in ``book._option_heads``): gathering sixteen columns and formatting the notes cost more
    than all the rest of the ten options together, and the same cheap offers head quote after quote."""
    memo: dict[int, _Head] = book._option_heads
    missing = [i for i in dict.fromkeys(rows) if i not in memo]
    if missing:
        if len(memo) + len(missing) > HEAD_MEMO_SIZE:
            memo.clear()
            missing = list(dict.fromkeys(rows))
        c = book.cols
        at = np.array(missing, dtype=np.int64)
        text = {k: book.texts(k, at) for k in ("provider", "sku", "region", "zone", "cluster", "gpu", "perf_source")}
        num = {k: c[k][at].tolist() for k in ("market", "fabric", "fabric_gbps", "interruptible", "stale",
                                               "measured", "tflops", "source", "observed_at")}
        for j, i in enumerate(missing):
            perf_source, tflops = text["perf_source"][j], num["tflops"][j]
            notes = []
            if num["measured"][j]:
                notes.append(f"measured {tflops:.0f} TFLOP/s per GPU ({perf_source})")
            elif perf_source == "dlperf":
                notes.append(f"speed prior from dlperf: {tflops:.0f} TFLOP/s per GPU")
            if num["stale"][j]:
                notes.append("offer is stale: its provider did not answer the last refresh")
            observed_ts = num["observed_at"][j]
            memo[i] = (book.ids[i], text["provider"][j], _MARKET_TEXT[num["market"][j]], text["sku"][j],
                       text["region"][j], text["zone"][j], text["cluster"][j], text["gpu"][j],
                       _FABRIC_TEXT[num["fabric"][j]], num["fabric_gbps"][j], num["interruptible"][j],
                       num["stale"][j], perf_source, SOURCES[num["source"][j]], _SOURCE_TEXT[num["source"][j]],
                       observed_ts,
                       datetime.fromtimestamp(observed_ts, UTC), tuple(notes))
    return [memo[i] for i in rows]


def _options(book: OfferBook, rows: np.ndarray, nodes: int, gpn: int, now: datetime,
             **figures: np.ndarray) -> list[dict[str, Any]]:
    """The options shown, as data for QuoteOption (enums as their text): only these rows become objects.
    Every figure is rounded in one call per column (:func:`rounded`, the same values as ``round``); what
    the offer alone decides comes from :func:`_heads`."""
    listed = rows.tolist()
    heads = _heads(book, listed)
    now_ts = now.timestamp()
    price = np.asarray(figures["price"], dtype=np.float64)
    c = book.cols
    extra = {"queue": c["queue"][rows], "compute_usd": price * figures["billed"],
             "age": now_ts - c["observed_at"][rows]}
    values = rounded(np.array([figures.get(k, extra.get(k)) for k in _ROUNDED], dtype=np.float64), _DIGITS,
                     _DIGITS_SCALE)
    labels: dict[tuple[OfferSource, float], str] = {}  # most options share a snapshot's
    out = []
    # Per option its head and its figures in _ROUNDED's order (one tuple each: no lookup per figure).
    per_option = zip(*values, strict=True)
    for (offer_id, provider, market, sku, region, zone, cluster, gpu, fabric, fabric_gbps, interruptible, stale,
         perf_source, kind, source, observed_ts, observed_at, notes), (
            price_r, wall, comp, comm, lost, queue, cost, egress, compute_usd, age) in zip(heads, per_option,
                                                                                           strict=True):
        label = labels.get((kind, observed_ts))
        if label is None:
            label = labels[kind, observed_ts] = source_label_at(kind, observed_ts, now_ts - observed_ts)
        out.append({
            "offer_id": offer_id, "provider": provider, "market": market,
            "sku": sku, "region": region, "zone": zone,
            "cluster": cluster, "nodes": nodes, "gpus_per_node": gpn, "gpu": gpu,
            "fabric": fabric, "fabric_gbps": fabric_gbps,
            "usd_per_hour": price_r, "expected_hours": wall,
            "expected_cost_usd": cost, "interruptible": interruptible,
            "stale": stale, "perf_source": perf_source, "source": source,
            "observed_at": observed_at, "age_s": age, "source_label": label,
            "breakdown": {
                "compute_hours": comp, "comm_hours": comm,
                "queue_wait_hours": queue, "preemption_overhead_hours": lost,
                "egress_usd": egress, "compute_usd": compute_usd,
                "notes": [*notes, f"price: {label}"] if source != _LIVE else list(notes),
            },
        })
    return out
