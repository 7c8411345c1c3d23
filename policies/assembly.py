"""Multi-node jobs assembled from single machines (a marketplace's independent boxes). Pure: no I/O, no clock.

A market like Vast.ai sells one machine per offer (``max_nodes=1``): no offer of its own can run a 2-node job.
When a job's co-location allows scattered machines (``colocate: zone|region|any``) and its fabric need is met
by plain ethernet (``fabric: ethernet|any``), :func:`assemble` groups single-machine offers into *synthetic*
multi-node offers that the ranking weighs beside every other option:

- **Compatible machines.** Each member passes the job's constraints as one node of it (GPU model, runtime,
  memory, GPUs per node, fabric speed, reliability, interruptible, market, region, health); the members of
  one assembly share provider, market, GPU model, GPUs per node and source; with ``colocate: region`` they
  share a region, with ``colocate: zone`` a (non-empty) zone. ``any`` also assembles across regions, unless
  the spec restricts regions (then each assembly stays in one, so the region check reads one name).
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
from collections import defaultdict
from collections.abc import Collection, Sequence

import numpy as np

from broker.gpus import GPU_SPECS
from broker.models import Colocate, Fabric, IntraNode, JobSpec, Locality, Network, Offer
from policies.book import OfferBook
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
        observed_at=min(m.observed_at for m in members), source=first.source, stale=any(m.stale for m in members),
        attrs={ASSEMBLED: "true", MEMBERS: ",".join(m.id for m in members)},
    )


def assemble(book: OfferBook, spec: JobSpec, *, exclude: Collection[str] = (),
             per_group: int = PER_GROUP) -> list[Offer]:
    """Assembled offers for ``spec`` from the single machines of ``book.assemblers``' providers.

    ``exclude``: offer ids of machines that are taken (held by a live allocation, or being launched on).
    """
    if not book.assemblers or not assemblable(spec) or not len(book):
        return []
    n = spec.nodes
    sc = screen(book, spec, members=True)
    rows = sc.rows[sc.codes == 0]
    if not len(rows):
        return []
    ok = book.providers.table(book.assemblers)[book["provider"][rows]]
    ok &= (book["max_nodes"][rows] < n) & ~book["divisible"][rows]
    rows = rows[ok]
    if len(rows) < n:
        return []
    rows = rows[np.lexsort((rows, book["price"][rows]))]  # cheapest first (book order breaks ties)
    taken = set(exclude)
    per_region = spec.colocate is not Colocate.any or bool(spec.regions)
    want = per_group * n  # members a group can use: only these become Offer objects
    c = book.cols
    keys = np.stack([c["provider"][rows], c["market"][rows].astype(np.int32), c["gpu"][rows],
                     c["gpu_count"][rows], c["region"][rows], c["zone"][rows]], axis=1).tolist()
    no_zone, no_region = book.codes["zone"].index.get(""), book.regions.index.get("")
    groups: dict[tuple[int, ...], list[Offer]] = defaultdict(list)
    scattered: dict[tuple[int, ...], list[Offer]] = defaultdict(list)
    for i, (prov, market, gpu, count, region, zone) in zip(rows.tolist(), keys, strict=True):
        base = (prov, market, gpu, count)
        if spec.colocate is Colocate.zone:
            key: tuple[int, ...] | None = (*base, region, zone) if zone != no_zone and region != no_region else None
        else:
            key = (*base, region) if region != no_region or not per_region else None
        fill = key is not None and len(groups[key]) < want
        spread = not per_region and len(scattered[base]) < want
        if not (fill or spread) or book.ids[i] in taken:
            continue
        o = book.offer(i)
        if fill and key is not None:
            groups[key].append(o)
        if spread:
            scattered[base].append(o)
    out: list[Offer] = []
    seen: set[str] = set()
    for group in (*groups.values(), *scattered.values()):
        for k in range(min(per_group, len(group) // n)):
            members = group[k * n:(k + 1) * n]
            if len({m.source for m in members}) > 1:  # a snapshot row never joins live machines
                continue
            made = combine(members)
            if made.id not in seen:
                seen.add(made.id)
                out.append(made)
    return out
