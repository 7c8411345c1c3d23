"""Multi-node jobs assembled from single machines (a marketplace's independent boxes). Pure: no I/O, no clock.

A market like Vast.ai sells one machine per offer (``max_nodes=1``): no offer of its own can run a 2-node job.
When a job's co-location allows scattered machines (``colocate: zone|region|any``) and its fabric need is met
by plain ethernet (``fabric: ethernet|any``), :func:`assemble` groups single-machine offers into *synthetic*
multi-node offers that the ranking weighs beside every other option:

- **Compatible machines.** Each member passes the job's constraints as one node of it (GPU model, runtime,
  memory, GPUs per node, fabric speed, reliability, interruptible, market, region, health); the members of
  one assembly share provider, market, GPU model and GPUs per node (an assembly with a snapshot row is never
  launched); with ``colocate: region`` they share a region, with ``colocate: zone`` a (non-empty) zone.
  ``any`` also assembles across regions, unless the spec restricts regions (then each assembly stays in one,
  so the region check reads one name).
- **The cheapest.** Per group the N cheapest machines (then the next N, up to ``per_group`` disjoint
  assemblies, so a failed rent has a fallback); machines a live allocation or a launch in flight holds are
  excluded by the caller (``exclude``).
- **Priced and shaped as one offer.** ``usd_per_hour`` is the members' mean, so the ranking's node price ×
  nodes is their sum; the fabric is ethernet at the slowest member's internet speed (the cost model's
  ethernet efficiency and latency then price the all-reduce across the internet); NVLink only if every member
  has it; the speed is the slowest member's (a synchronous job runs at its pace); reliability is the product
  (the chance that no machine fails); egress the highest; region the common one, else the regions joined with
  ``+`` (so no data location counts as local to it).

The core decides what may be assembled by capability, never by name: the market lists the providers whose
class is :class:`~providers.capabilities.AssemblesNodes` in ``OfferBook.assemblers``. An assembled offer's id
is its members' ids joined with ``+`` (:func:`member_ids` reads it back); ``attrs["members"]`` lists them too.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from broker.gpus import GPU_SPECS
from broker.models import Colocate, Fabric, IntraNode, JobSpec, Locality, Network, Offer, OfferSource
from policies.book import COLOCATIONS, FABRICS, INTRAS, OfferBook
from policies.constraints import screen

SEP = "+"  # joins member offer ids into an assembled offer's id (no market's offer id contains it)
ASSEMBLED = "assembled"  # attrs key: "true" on an assembled offer
MEMBERS = "members"  # attrs key: the member offer ids, comma-separated, in rank order
PER_GROUP = 3  # disjoint assemblies per group of compatible machines
SCATTER_OK = frozenset({Colocate.zone, Colocate.region, Colocate.any})


def assemblable(spec: JobSpec) -> bool:
    """True when the job may run on separately rented machines: several nodes, a co-location looser than a
    cluster, and a fabric need plain ethernet meets (never ``cluster|rack|node``, never RDMA)."""
    return spec.nodes > 1 and spec.colocate in SCATTER_OK and spec.fabric.accepts(Fabric.ethernet)


def member_ids(offer_id: str) -> list[str]:
    """The member offer ids of an assembled offer's id; ``[offer_id]`` for any other offer."""
    return offer_id.split(SEP) if SEP in offer_id else [offer_id]


def is_assembled(offer_id: str) -> bool:
    return SEP in offer_id


def _tflops(o: Offer) -> float:
    sheet = GPU_SPECS[o.gpu].tflops_bf16 if o.gpu in GPU_SPECS else 0.0
    if o.perf is not None:
        if o.perf.tflops_bf16:
            return o.perf.tflops_bf16
        if o.perf.relative:
            return sheet * o.perf.relative
    return sheet


def combine(members: Sequence[Offer]) -> Offer:
    """One offer of ``len(members)`` nodes made of ``members`` (one machine each, rank order)."""
    if len(members) < 2:
        raise ValueError("an assembly needs at least two machines")
    first, n = members[0], len(members)
    regions = sorted({m.region for m in members})
    zones = {m.zone for m in members}
    region = regions[0] if len(regions) == 1 else SEP.join(regions)
    zone = first.zone if len(zones) == 1 else ""
    if len(regions) > 1 or not region:
        colocation = Colocate.any
    elif zone:
        colocation = Colocate.zone
    else:
        colocation = Colocate.region
    reliabilities = [m.reliability for m in members if m.reliability is not None]
    slowest = min(members, key=_tflops)
    downs = [m.network.inet_down_mbps for m in members if m.network.inet_down_mbps]
    ups = [m.network.inet_up_mbps for m in members if m.network.inet_up_mbps]
    return Offer(
        id=SEP.join(m.id for m in members), provider=first.provider, market=first.market, sku=first.sku,
        gpu=first.gpu, gpu_count=first.gpu_count, gpu_memory_gb=min(m.gpu_memory_gb for m in members),
        vcpus=min(m.vcpus for m in members), ram_gb=min(m.ram_gb for m in members),
        disk_gb=min(m.disk_gb for m in members),
        usd_per_hour=round(sum(m.usd_per_hour for m in members) / n, 6),
        interruptible=any(m.interruptible for m in members), max_nodes=n, colocation=colocation,
        locality=Locality(provider=first.locality.provider, region=region, zone=zone),
        network=Network(
            intra=IntraNode.nvlink if all(m.network.intra is IntraNode.nvlink for m in members) else IntraNode.pcie,
            fabric=Fabric.ethernet, fabric_gbps=min(m.network.fabric_gbps for m in members),
            inet_down_mbps=min(downs) if downs else None, inet_up_mbps=min(ups) if ups else None),
        reliability=math.prod(reliabilities) if reliabilities else None, perf=slowest.perf,
        egress_usd_per_gb=max(m.egress_usd_per_gb for m in members),
        observed_at=min(m.observed_at for m in members), stale=any(m.stale for m in members),
        # A snapshot row never makes a launchable assembly, whatever the other machines are.
        source=OfferSource.snapshot if any(m.source is OfferSource.snapshot for m in members) else first.source,
        attrs={ASSEMBLED: "true", MEMBERS: ",".join(m.id for m in members)},
    )


def _member_rows(book: OfferBook, spec: JobSpec, exclude: Collection[str]) -> np.ndarray:
    """The book rows that may be members of an assembly for ``spec``, cheapest first."""
    sc = screen(book, spec, members=True)
    rows = sc.rows[sc.codes == 0]
    c = book.cols
    rows = rows[book.providers.table(book.assemblers)[c["provider"][rows]]
                & (c["max_nodes"][rows] < spec.nodes) & ~c["divisible"][rows]]
    if exclude and len(rows):
        taken = set(exclude)
        rows = rows[np.fromiter((book.ids[i] not in taken for i in rows.tolist()), dtype=bool, count=len(rows))]
    cheapest: np.ndarray = rows[np.lexsort((rows, c["price"][rows]))]  # book order breaks ties
    return cheapest


def _chunks(rows: np.ndarray, keys: list[np.ndarray], n: int, per_group: int) -> np.ndarray:
    """Per group of equal ``keys`` (``rows`` cheapest first): its first ``per_group`` runs of ``n`` rows, as an
    (assemblies × n) array of book rows, each assembly's members cheapest first."""
    if len(rows) < n:
        return np.zeros((0, n), dtype=np.int64)
    key = np.zeros(len(rows), dtype=np.int64)
    for k in keys:  # one integer per group (codes are small: the radix is each column's largest + 1)
        key = key * (int(k.max()) + 1) + k
    order = np.argsort(key, kind="stable")  # by group; cheapest first inside each
    g = key[order]
    starts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
    sizes = np.diff(np.append(starts, len(g)))
    rank = np.arange(len(g)) - np.repeat(starts, sizes)
    usable = np.repeat(np.minimum(per_group, sizes // n) * n, sizes)  # whole assemblies only
    picked: np.ndarray = rows[order[rank < usable]]
    return picked.reshape(-1, n)


def assemble(book: OfferBook, spec: JobSpec, *, exclude: Collection[str] = (),
             per_group: int = PER_GROUP) -> OfferBook | None:
    """The assembled offers for ``spec`` as a book of their own (None when there are none), made from the single
    machines of ``book.assemblers``' providers; ranked by :func:`policies.ranking.quote` beside ``book``.

    Vectorised over the book's columns: no Offer is made (the router makes the chosen one again from its
    machines with :func:`combine`). ``exclude``: offer ids of machines that are taken (held by a live
    allocation, or being launched on).
    """
    if not book.assemblers or not assemblable(spec) or not len(book):
        return None
    n = spec.nodes
    rows = _member_rows(book, spec, exclude)
    if len(rows) < n:
        return None
    c = book.cols
    no_zone, no_region = book.codes["zone"].index.get("", -1), book.regions.index.get("", -1)
    base = [c["provider"][rows], c["market"][rows], c["gpu"][rows], c["gpu_count"][rows]]
    per_region = spec.colocate is not Colocate.any or bool(spec.regions)
    parts = []
    if spec.colocate is Colocate.zone:  # a zone only where a market names one
        sel = (c["zone"][rows] != no_zone) & (c["region"][rows] != no_region)
        parts.append(_chunks(rows[sel], [k[sel] for k in base] + [c["region"][rows[sel]], c["zone"][rows[sel]]],
                             n, per_group))
    else:
        sel = c["region"][rows] != no_region if per_region else np.ones(len(rows), dtype=bool)
        parts.append(_chunks(rows[sel], [k[sel] for k in base] + [c["region"][rows[sel]]], n, per_group))
    if not per_region:  # any: also the cheapest machines wherever they are
        parts.append(_chunks(rows, base, n, per_group))
    members = np.unique(np.concatenate(parts), axis=0) if len(parts) > 1 else parts[0]
    if not len(members):
        return None
    return _columns_book(book, members)


def _columns_book(book: OfferBook, m: np.ndarray) -> OfferBook:
    """The book of the assemblies ``m`` (assemblies × nodes, book rows): each one row, its figures reduced from its
    machines' columns as :func:`combine` reduces their offers."""
    c = book.cols
    n = m.shape[1]
    first = m[:, 0]
    region_codes = c["region"][m]
    same_region = (region_codes == region_codes[:, :1]).all(axis=1)
    zone_codes = c["zone"][m]
    same_zone = (zone_codes == zone_codes[:, :1]).all(axis=1)
    region_names = book.regions.names
    regions = [region_names[r[0]] if same else SEP.join(sorted({region_names[x] for x in r}))
               for r, same in zip(region_codes.tolist(), same_region.tolist(), strict=True)]
    zones = [z if same else "" for z, same in zip(book.texts("zone", first), same_zone.tolist(), strict=True)]
    coloc = np.where(~same_region | (region_codes[:, 0] == book.regions.index.get("", -1)),
                     COLOCATIONS.index(Colocate.any),
                     np.where(same_zone & (zone_codes[:, 0] != book.codes["zone"].index.get("", -1)),
                              COLOCATIONS.index(Colocate.zone), COLOCATIONS.index(Colocate.region)))
    tflops = c["tflops"][m]
    slowest = m[np.arange(len(m)), np.argmin(tflops, axis=1)]
    reliability = c["reliability"][m]
    known = ~np.isnan(reliability)
    rel = np.where(known.any(axis=1), np.prod(np.where(known, reliability, 1.0), axis=1), np.nan)
    down = c["inet_down_mbps"][m]
    ids = [SEP.join(book.ids[i] for i in row) for row in m.tolist()]
    shared = ("provider", "gpu", "site", "sku")  # the first machine's, in the book's own codes
    data: dict[str, Any] = {
        "id": ids, **{f: c[f][first] for f in shared}, "perf_source": c["perf_source"][slowest],
        "codes": {f: book.codes[f] for f in (*shared, "perf_source")}, "region": regions, "zone": zones,
        "gpu_count": c["gpu_count"][first], "price": c["price"][m].sum(axis=1) / n, "market": c["market"][first],
        "gpu_mem": c["gpu_mem"][m].min(axis=1), "interruptible": c["interruptible"][m].any(axis=1),
        "max_nodes": n, "coloc": coloc, "fabric": FABRICS.index(Fabric.ethernet),
        "fabric_gbps": c["fabric_gbps"][m].min(axis=1),
        "intra": np.where((c["intra"][m] == INTRAS.index(IntraNode.nvlink)).all(axis=1),
                          INTRAS.index(IntraNode.nvlink), INTRAS.index(IntraNode.pcie)),
        "tflops": tflops.min(axis=1), "measured": c["measured"][slowest], "reliability": rel,
        "stale": c["stale"][m].any(axis=1), "egress": c["egress"][m].max(axis=1),
        "queue": c["queue"][m].max(axis=1),
        "inet_down_mbps": np.where(np.isnan(down).all(axis=1), np.nan,
                                   np.where(np.isnan(down), np.inf, down).min(axis=1)),
        "observed_at": c["observed_at"][m].min(axis=1),
    }
    # The sites' declared egress is the whole book's (site codes are shared), so data elsewhere costs the same to
    # move to an assembly as to any other offer.
    out = replace(OfferBook.from_columns(data), site_egress=book.site_egress, owned_egress=book.owned_egress)
    # Each machine may be preempted: an assembly is interrupted as often as all its machines together.
    rate = c["preempt_rate"][m].sum(axis=1)
    at = {oid: i for i, oid in enumerate(ids)}
    out.cols["preempt_rate"] = rate[[at[i] for i in out.ids]]
    return out
