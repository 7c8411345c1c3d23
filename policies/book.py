"""The offer book: offers as columns (one numpy array per attribute), indexed by what queries select on.

A quote must filter and rank 50,000 offers in well under a millisecond, and a
book of a million offers must fit in memory and quote in milliseconds. So:

- **Columns, not objects.** Each attribute is one array; strings are interned to
  small integer codes. A row costs ~250 bytes. The book never needs a pydantic
  ``Offer`` per row: :meth:`OfferBook.from_columns` builds it from arrays, and
  :meth:`OfferBook.offer` materialises the few rows a quote shows. Built from
  offers (:meth:`OfferBook.build`, what the market does once per refresh), it
  keeps a reference to them and hands back the very objects.
- **An index.** Rows are sorted by (GPU model, market, provider, region); each
  run of equal keys is a *group*. The checks that depend only on those keys
  (provider, market, region, GPU model, runtime) run once per group, and a quote
  touches only the rows of the groups that pass.
- **Health overlays.** Node health and spot preemption rates change between
  refreshes; :meth:`OfferBook.with_health` swaps those two columns in without
  rebuilding the rest.

Pure: data in, arrays out; no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from broker.gpus import GPU_SPECS, Vendor, fold
from broker.models import (
    FABRIC_RANK,
    Colocate,
    Fabric,
    IntraNode,
    Locality,
    Market,
    Network,
    Offer,
    OfferSource,
    Perf,
)
from broker.perf import DEFAULT_DOWNLOAD_GBPS, FABRIC_EFFICIENCY, FABRIC_LATENCY_US, INTRA_BUSBW_GBPS

MARKETS: tuple[Market, ...] = tuple(Market)
FABRICS: tuple[Fabric, ...] = tuple(Fabric)
COLOCATIONS: tuple[Colocate, ...] = tuple(Colocate)
INTRAS: tuple[IntraNode, ...] = tuple(IntraNode)
SOURCES: tuple[OfferSource, ...] = tuple(OfferSource)  # the "source" column: where a row's price comes from
VENDORS: tuple[Vendor | None, ...] = (None, *Vendor)  # code 0: a GPU the table does not know
OWNED = MARKETS.index(Market.owned)
DEFAULT_SPOT_PREEMPTIONS_PER_HOUR = 0.05  # when no history says otherwise
DATASHEET = "datasheet"

_FABRIC_EFF = np.array([FABRIC_EFFICIENCY[f] for f in FABRICS])
_FABRIC_LAT = np.array([FABRIC_LATENCY_US[f] for f in FABRICS])
_FABRIC_RANK = np.array([FABRIC_RANK[f] for f in FABRICS], dtype=np.int8)
_INTRA_BW = np.array([INTRA_BUSBW_GBPS[i] for i in INTRAS])


class Codes:
    """Interns strings to small ints so comparisons run on integer arrays."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        for n in names:
            self.code(n)

    def __len__(self) -> int:
        return len(self.names)

    def code(self, name: str) -> int:
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.names)
            self.names.append(name)
        return i

    def encode(self, values: Sequence[str]) -> np.ndarray:
        return np.fromiter((self.code(v) for v in values), dtype=np.int32, count=len(values))

    def codes_of(self, names: Iterable[str]) -> np.ndarray:
        return np.array([self.index[n] for n in names if n in self.index], dtype=np.int32)

    def table(self, names: Iterable[str]) -> np.ndarray:
        """A boolean table indexed by code, True for ``names``: faster than np.isin on every quote."""
        t = np.zeros(max(len(self.names), 1), dtype=bool)
        t[self.codes_of(names)] = True
        return t


# Per-row text, interned (codes in the columns of the same name).
TEXT_FIELDS = ("provider", "gpu", "region", "site", "sku", "zone", "cluster", "rack", "host", "perf_source")
# What from_columns takes besides ``id`` and the text fields: (dtype, default; None: required).
NUMERIC: dict[str, tuple[Any, Any]] = {
    "gpu_count": (np.int32, None), "price": (np.float64, None), "market": (np.int8, None),
    "gpu_mem": (np.float64, 0.0), "divisible": (bool, False), "interruptible": (bool, False),
    "max_nodes": (np.int32, 1), "coloc": (np.int8, COLOCATIONS.index(Colocate.node)),
    "fabric": (np.int8, FABRICS.index(Fabric.none)), "fabric_gbps": (np.float64, 0.0),
    "intra": (np.int8, INTRAS.index(IntraNode.pcie)), "tflops": (np.float64, np.nan), "measured": (bool, False),
    "fabric_lat": (np.float64, np.nan), "reliability": (np.float64, np.nan), "stale": (bool, False),
    "egress": (np.float64, 0.0), "queue": (np.float64, 0.0), "inet_down_mbps": (np.float64, np.nan),
    "observed_at": (np.float64, 0.0), "source": (np.int8, SOURCES.index(OfferSource.live)),
    "no_image": (bool, False),  # runs commands on its hosts only: attrs["containers"] == "none"
}


def offer_columns(offers: Sequence[Offer]) -> dict[str, Any]:
    """The columns of ``offers`` (one pass), as :meth:`OfferBook.from_columns` takes them."""
    n = len(offers)
    text: dict[str, list[str]] = {k: [""] * n for k in TEXT_FIELDS}
    num = {k: np.empty(n, dtype=dtype) for k, (dtype, _) in NUMERIC.items()}
    fabric_index = {f: i for i, f in enumerate(FABRICS)}
    market_index = {m: i for i, m in enumerate(MARKETS)}
    coloc_index = {c: i for i, c in enumerate(COLOCATIONS)}
    source_index = {c: i for i, c in enumerate(SOURCES)}
    intra_index = {c: i for i, c in enumerate(INTRAS)}
    ids: list[str] = [""] * n
    nodes: dict[int, tuple[str, ...]] = {}
    for i, o in enumerate(offers):
        loc, net, perf = o.locality, o.network, o.perf
        ids[i] = o.id
        text["provider"][i], text["gpu"][i], text["sku"][i] = o.provider, o.gpu, o.sku
        text["region"][i], text["site"][i], text["zone"][i] = loc.region, loc.provider, loc.zone
        text["cluster"][i], text["rack"][i], text["host"][i] = loc.cluster, loc.rack, loc.host
        text["perf_source"][i] = perf.source if perf is not None else DATASHEET
        tflops, measured = np.nan, False
        if perf is not None:
            datasheet = GPU_SPECS[o.gpu].tflops_bf16 if o.gpu in GPU_SPECS else 0.0
            if perf.tflops_bf16:
                tflops, measured = perf.tflops_bf16, perf.source != "dlperf"
            elif perf.relative:
                tflops, measured = datasheet * perf.relative, perf.source != "dlperf"
        num["gpu_count"][i] = o.gpu_count
        num["price"][i] = o.usd_per_hour
        num["market"][i] = market_index[o.market]
        num["gpu_mem"][i] = o.gpu_memory_gb
        num["divisible"][i] = o.divisible
        num["interruptible"][i] = o.interruptible
        num["max_nodes"][i] = o.max_nodes
        num["coloc"][i] = coloc_index[o.colocation]
        num["fabric"][i] = fabric_index[net.fabric]
        num["fabric_gbps"][i] = net.fabric_gbps
        num["intra"][i] = intra_index[IntraNode(net.intra)]
        num["tflops"][i] = tflops
        num["measured"][i] = measured
        num["fabric_lat"][i] = perf.allreduce_latency_us if perf and perf.allreduce_latency_us else np.nan
        num["reliability"][i] = np.nan if o.reliability is None else o.reliability
        num["stale"][i] = o.stale
        num["egress"][i] = o.egress_usd_per_gb
        num["queue"][i] = o.queue_wait_hours
        num["inet_down_mbps"][i] = net.inet_down_mbps or np.nan
        num["observed_at"][i] = o.observed_at.timestamp()
        num["no_image"][i] = o.attrs.get("containers") == "none"
        num["source"][i] = source_index[o.source]
        if o.attrs.get("nodes"):
            nodes[i] = tuple(o.attrs["nodes"].split(","))
    return {"id": ids, **text, **num, "nodes": nodes}


@dataclass(frozen=True)
class Groups:
    """Runs of rows with equal (gpu, market, provider, region), in book order."""

    gpu: np.ndarray
    market: np.ndarray
    provider: np.ndarray
    region: np.ndarray
    start: np.ndarray
    size: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    def rows(self, which: np.ndarray) -> np.ndarray:
        """The book rows of the groups where ``which`` (a boolean per group) holds, in book order."""
        starts, sizes = self.start[which], self.size[which]
        total = int(sizes.sum())
        if total == 0:
            return np.empty(0, dtype=np.int64)
        if len(starts) == 1:
            return np.arange(starts[0], starts[0] + total, dtype=np.int64)
        ends = np.cumsum(sizes)
        rows: np.ndarray = np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - sizes), sizes)
        return rows

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The group index of each book row in ``rows``."""
        return np.searchsorted(self.start, rows, side="right") - 1

    def runs(self, which: np.ndarray) -> list[tuple[int, int]]:
        """The same rows as (start, stop) runs of consecutive rows: adjacent groups merged."""
        edges = np.diff(np.concatenate(([0], which.view(np.int8), [0])))
        first, after = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        stops = self.start[after - 1] + self.size[after - 1]
        return list(zip(self.start[first].tolist(), stops.tolist(), strict=True))


def _groups(cols: Mapping[str, np.ndarray], n: int) -> Groups:
    """The index's groups over columns already sorted by (gpu, market, provider, region)."""
    key = np.stack([cols["gpu"], cols["market"].astype(np.int32), cols["provider"], cols["region"]])
    change = np.flatnonzero((key[:, 1:] != key[:, :-1]).any(axis=0)) + 1 if n else np.zeros(0, np.int64)
    start = np.concatenate(([0], change)).astype(np.int64) if n else np.zeros(0, np.int64)
    size = np.diff(np.append(start, n)).astype(np.int64)
    return Groups(gpu=cols["gpu"][start], market=cols["market"][start], provider=cols["provider"][start],
                  region=cols["region"][start], start=start, size=size)


# What makes two offers the same *shape* for the ranking: every column the constraints and the cost model
# read except the price (policies/constraints.py, policies/ranking.py; derived columns such as fabric_eff
# and intra_bw follow from one here). Two offers of one shape pass the same checks and take the same
# hours for any job, so the dearer one can never rank ahead of the cheaper (see PrunedView).
SHAPE_COLUMNS = ("gpu", "market", "provider", "region", "site", "unhealthy", "no_image", "gpu_mem", "gpu_count",
                 "max_nodes", "coloc", "fabric", "fabric_gbps", "fabric_lat", "intra", "reliability",
                 "interruptible", "divisible", "tflops", "download_gbps", "preempt_rate", "queue", "stale", "source")
_MIX = np.uint64(0x9E3779B97F4A7C15)
# Below this many offers (and candidate rows for a job) a quote takes the plain pass and no view is built:
# the small books of everyday use never fold (policies/ranking.py).
PRUNE_MIN_ROWS = 20_000


def _bits(a: np.ndarray) -> np.ndarray:
    """A column as uint64 words, equal exactly when the values are (floats by their bit pattern)."""
    if a.dtype.kind == "f":
        return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)
    return a.astype(np.uint64)


@dataclass(frozen=True)
class PrunedView:
    """The book folded by shape: one row per shape class (its cheapest offer), and every class's offers,
    cheapest first.

    Within a class the offers differ only in price (and id, and what only names them: SKU, zone, host), so
    for any job they pass or fail the non-price checks together, take the same hours and rank by price.
    Hence the top N offers of the whole book lie among the first N offers (by price, then book row) of the
    classes whose cheapest offer is in the top N of ``reps`` — a book of one row per class, which the
    ranking screens and prices instead of every offer (policies/ranking.py). Built once per book version
    (a refresh, a change of health or spot rates), on the first quote that wants it."""

    reps: OfferBook  # per class its cheapest offer (lowest book row among equal prices), in book order
    size: np.ndarray  # per reps row: offers in its class
    start: np.ndarray  # per reps row: where its class begins in ``members``
    members: np.ndarray  # book rows, class by class in reps order, each class by (price, row)

    def first(self, rep_rows: np.ndarray, n: int) -> np.ndarray:
        """The book rows of the first ``n`` offers of each class in ``rep_rows``, ascending."""
        take = np.minimum(self.size[rep_rows], n)
        total = int(take.sum())
        ends = np.cumsum(take)
        pos = np.arange(total, dtype=np.int64) + np.repeat(self.start[rep_rows] - (ends - take), take)
        return np.sort(self.members[pos])


@dataclass(frozen=True)
class GroupScreen:
    """The group checks' verdict for one job key (see :func:`policies.constraints.screen`): per group 0 or
    the check it breaks; the candidate rows as runs; the rows themselves when few (kept only then: at a
    million offers they would weigh megabytes per key). Arrays read-only: shared by every quote of the key."""

    codes: np.ndarray
    runs: list[tuple[int, int]]
    rows: np.ndarray | None


class OfferRow:
    """A read-only view of one book row with the attributes the reasons and options read (an Offer's
    names): no object per row exists until a caller asks for a row."""

    __slots__ = ("_book", "_i")

    def __init__(self, book: OfferBook, i: int) -> None:
        self._book, self._i = book, i

    def _t(self, name: str) -> str:
        return self._book.text(name, self._i)

    def _int(self, name: str) -> int:
        return int(self._book.cols[name][self._i])

    def _float(self, name: str) -> float:
        return float(self._book.cols[name][self._i])

    @property
    def id(self) -> str:
        return self._book.ids[self._i]

    @property
    def provider(self) -> str:
        return self._t("provider")

    @property
    def sku(self) -> str:
        return self._t("sku")

    @property
    def gpu(self) -> str:
        return self._t("gpu")

    @property
    def region(self) -> str:
        return self._t("region")

    @property
    def zone(self) -> str:
        return self._t("zone")

    @property
    def market(self) -> Market:
        return MARKETS[self._int("market")]

    @property
    def colocation(self) -> Colocate:
        return COLOCATIONS[self._int("coloc")]

    @property
    def fabric(self) -> Fabric:
        return FABRICS[self._int("fabric")]

    @property
    def fabric_gbps(self) -> float:
        return self._float("fabric_gbps")

    @property
    def gpu_count(self) -> int:
        return self._int("gpu_count")

    @property
    def gpu_memory_gb(self) -> float:
        return self._float("gpu_mem")

    @property
    def usd_per_hour(self) -> float:
        return self._float("price")

    @property
    def divisible(self) -> bool:
        return bool(self._book.cols["divisible"][self._i])

    @property
    def max_nodes(self) -> int:
        return self._int("max_nodes")

    @property
    def reliability(self) -> float | None:
        r = self._float("reliability")
        return None if r != r else r  # NaN: the market does not say


@dataclass
class OfferBook:
    cols: dict[str, np.ndarray]
    codes: dict[str, Codes]
    ids: list[str]
    groups: Groups
    # Multi-node offers listing their hosts (Slurm): book row → host names, for health.
    nodes: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # Built from offers: those offers and, per book row, its index among them.
    source: Sequence[Offer] | None = None
    order: np.ndarray | None = None
    # Per site code: the highest egress price its offers declare; and the owned market's.
    site_egress: np.ndarray = field(default_factory=lambda: np.zeros(0))
    owned_egress: float = 0.0
    gpu_vendor: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))  # per gpu code
    any_unhealthy: bool = False
    unhealthy_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    any_divisible: bool = False  # some rows are paid per GPU taken (owned nodes)
    any_queue: bool = False  # some rows wait in a queue before they start
    # Providers whose offers are independent single machines the broker may assemble into a multi-node
    # job (policies/assembly.py): set by the market from the AssemblesNodes capability.
    assemblers: frozenset[str] = frozenset()
    _folded_gpus: dict[str, int] | None = None
    _pruned: PrunedView | None = None
    # What the group checks gave per job key (policies/constraints.py, screen): they read only the index's
    # keys and the interned codes, which a new book version from :meth:`with_health` keeps.
    _group_memo: dict[tuple[object, ...], GroupScreen] = field(default_factory=dict)
    # What a quote's option shows of a row's offer that no job and no clock changes (policies/ranking.py,
    # _heads), per book row: read from columns a new book version from :meth:`with_health` keeps as they are.
    _option_heads: dict[int, Any] = field(default_factory=dict)
    # policies/ranking.py, _missing_models: per GPU list, the models no offer is of (names only: shared).
    _missing_memo: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict)
    # policies/constraints.py, screen: its answer per job key, on this book version only (it reads health).
    _screen_memo: dict[tuple[object, ...], Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name]

    @property
    def providers(self) -> Codes:
        return self.codes["provider"]

    @property
    def gpus(self) -> Codes:
        return self.codes["gpu"]

    @property
    def regions(self) -> Codes:
        return self.codes["region"]

    @property
    def sites(self) -> Codes:
        return self.codes["site"]

    # ------------------------------------------------------------------ building

    @classmethod
    def build(
        cls,
        offers: Iterable[Offer],
        *,
        unhealthy_hosts: Mapping[tuple[str, str], str] | None = None,
        preemption_rates: Mapping[tuple[str, str, str], float] | None = None,
    ) -> OfferBook:
        """The book of ``offers`` (kept, and handed back by :meth:`offer`).

        ``unhealthy_hosts`` maps (provider, host) to a reason; those offers are
        rejected. ``preemption_rates`` maps (provider, zone, sku) to observed
        preemptions per hour for interruptible offers.
        """
        offers = offers if isinstance(offers, Sequence) else list(offers)
        book = cls.from_columns(offer_columns(offers), source=offers)
        if unhealthy_hosts or preemption_rates:
            book = book.with_health(unhealthy_hosts, preemption_rates)
        return book

    @classmethod
    def from_columns(cls, data: Mapping[str, Any], *, source: Sequence[Offer] | None = None) -> OfferBook:
        """A book from columns: ``id`` (strings), the text fields (strings, or codes with their
        ``Codes`` under ``codes``), and the numeric fields of ``NUMERIC`` (arrays or
        scalars). No Offer objects are needed; :meth:`offer` makes them for the rows shown."""
        ids = list(data["id"])
        n = len(ids)
        given_codes: Mapping[str, Codes] = data.get("codes") or {}
        codes: dict[str, Codes] = {}
        raw: dict[str, np.ndarray] = {}
        for name in TEXT_FIELDS:
            values = data.get(name)
            if name in given_codes:
                codes[name] = given_codes[name]
                raw[name] = np.asarray(values, dtype=np.int32)
            else:
                codes[name] = Codes()
                raw[name] = codes[name].encode(values if values is not None else [""] * n)
        for name, (dtype, default) in NUMERIC.items():
            value = data.get(name, default)
            if value is None:
                raise ValueError(f"column {name} is required")
            raw[name] = np.broadcast_to(np.asarray(value, dtype=dtype), (n,))

        # The index: sort by the group key, once.
        order = np.lexsort((raw["region"], raw["provider"], raw["market"], raw["gpu"]))
        identity = bool(n == 0 or (order[1:] > order[:-1]).all())
        cols = {k: (v if identity else v[order]).copy() for k, v in raw.items()}
        ids_sorted = ids if identity else [ids[i] for i in order]
        nodes_in: Mapping[int, tuple[str, ...]] = data.get("nodes") or {}
        nodes = dict(nodes_in) if identity else {
            int(r): nodes_in[int(o)] for r, o in enumerate(order) if int(o) in nodes_in
        }

        # Derived columns: fabric figures, datasheet speed where nothing was measured.
        fabric = cols["fabric"]
        cols["fabric_rank"] = _FABRIC_RANK[fabric]
        cols["fabric_eff"] = _FABRIC_EFF[fabric]
        cols["fabric_lat"] = np.where(np.isnan(cols["fabric_lat"]), _FABRIC_LAT[fabric], cols["fabric_lat"])
        cols["intra_bw"] = _INTRA_BW[cols["intra"]]
        gpu_names = codes["gpu"].names
        datasheet = np.array([GPU_SPECS[g].tflops_bf16 if g in GPU_SPECS else 0.0 for g in gpu_names] or [0.0])
        memory = np.array([GPU_SPECS[g].memory_gb if g in GPU_SPECS else 0.0 for g in gpu_names] or [0.0])
        vendor = np.array([VENDORS.index(GPU_SPECS[g].vendor) if g in GPU_SPECS else 0 for g in gpu_names] or [0],
                          dtype=np.int8)
        cols["tflops"] = np.where(np.isnan(cols["tflops"]), datasheet[cols["gpu"]], cols["tflops"])
        cols["gpu_mem"] = np.where(cols["gpu_mem"] > 0, cols["gpu_mem"], memory[cols["gpu"]])
        cols["price_per_gpu"] = cols["price"] / np.maximum(cols["gpu_count"], 1)
        cols["download_gbps"] = np.where(np.isnan(cols["inet_down_mbps"]), DEFAULT_DOWNLOAD_GBPS,
                                         cols["inet_down_mbps"] / 1000.0)
        cols["preempt_rate"] = np.where(cols["interruptible"], DEFAULT_SPOT_PREEMPTIONS_PER_HOUR, 0.0)
        cols["unhealthy"] = np.zeros(n, dtype=bool)

        groups = _groups(cols, n)
        site_egress = np.zeros(max(len(codes["site"]), 1))
        if n:
            np.maximum.at(site_egress, cols["site"], cols["egress"])
        owned = cols["market"] == OWNED
        owned_egress = float(cols["egress"][owned].max()) if owned.any() else 0.0
        return cls(cols=cols, codes=codes, ids=ids_sorted, groups=groups, nodes=nodes, source=source,
                   order=None if source is None else order, site_egress=site_egress, owned_egress=owned_egress,
                   gpu_vendor=vendor, any_divisible=bool(cols["divisible"].any()),
                   any_queue=bool(cols["queue"].any()))

    def with_health(
        self,
        unhealthy_hosts: Mapping[tuple[str, str], str] | None = None,
        preemption_rates: Mapping[tuple[str, str, str], float] | None = None,
    ) -> OfferBook:
        """The same book with node health and spot preemption rates applied (two columns swapped)."""
        cols = dict(self.cols)
        prov, host = self.codes["provider"], self.codes["host"]
        unhealthy = np.zeros(len(self), dtype=bool)
        if unhealthy_hosts:
            bad = np.zeros((max(len(prov), 1), max(len(host), 1)), dtype=bool)
            for p, h in unhealthy_hosts:
                if p in prov.index and h in host.index:
                    bad[prov.index[p], host.index[h]] = True
            if bad.any():
                unhealthy = bad[cols["provider"], cols["host"]] & (cols["host"] != host.index.get("", -1))
            for row, hosts in self.nodes.items():
                p = prov.names[cols["provider"][row]]
                if any((p, h) in unhealthy_hosts for h in hosts):
                    unhealthy[row] = True
        cols["unhealthy"] = unhealthy
        rate = np.where(cols["interruptible"], DEFAULT_SPOT_PREEMPTIONS_PER_HOUR, 0.0)
        if preemption_rates:
            zone, sku = self.codes["zone"], self.codes["sku"]
            nz, ns = max(len(zone), 1), max(len(sku), 1)
            keyed = {(prov.index[p] * nz + zone.index[z]) * ns + sku.index[s]: r
                     for (p, z, s), r in preemption_rates.items()
                     if p in prov.index and z in zone.index and s in sku.index}
            if keyed:
                keys = np.array(sorted(keyed), dtype=np.int64)
                values = np.array([keyed[k] for k in keys.tolist()])
                row_key = (cols["provider"].astype(np.int64) * nz + cols["zone"]) * ns + cols["sku"]
                pos = np.minimum(np.searchsorted(keys, row_key), len(keys) - 1)
                hit = (keys[pos] == row_key) & cols["interruptible"]
                rate[hit] = values[pos[hit]]
        cols["preempt_rate"] = rate
        bad_rows = np.flatnonzero(unhealthy)
        return replace(self, cols=cols, any_unhealthy=bool(len(bad_rows)), unhealthy_rows=bad_rows, _pruned=None,
                       _screen_memo={})

    def subset(self, rows: np.ndarray) -> OfferBook:
        """Rows ``rows`` (ascending) as a book of their own that ranks them exactly as this book does: the
        same interned codes and book-wide figures (egress per site), its own index."""
        cols = {k: v[rows] for k, v in self.cols.items()}
        listed = rows.tolist()
        nodes = {j: self.nodes[r] for j, r in enumerate(listed) if r in self.nodes} if self.nodes else {}
        bad_rows = np.flatnonzero(cols["unhealthy"])
        return OfferBook(
            cols=cols, codes=self.codes, ids=[self.ids[r] for r in listed], groups=_groups(cols, len(listed)),
            nodes=nodes, source=self.source, order=None if self.order is None else self.order[rows],
            site_egress=self.site_egress, owned_egress=self.owned_egress, gpu_vendor=self.gpu_vendor,
            any_unhealthy=bool(len(bad_rows)), unhealthy_rows=bad_rows, any_divisible=self.any_divisible,
            any_queue=self.any_queue, assemblers=self.assemblers)

    def pruned(self) -> PrunedView:
        """This book folded by shape (:class:`PrunedView`), built on first use and kept with the book."""
        if self._pruned is None:
            self._pruned = self._prune()
        return self._pruned

    def _prune(self) -> PrunedView:
        n = len(self)
        cols = self.cols
        words = [_bits(cols[name]) for name in SHAPE_COLUMNS]
        h = np.zeros(n, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for w in words:  # a 64-bit hash of the shape, then checked word by word (no collision trusted)
                h = (h ^ w) * _MIX
                h ^= h >> np.uint64(29)
        _, first, klass = np.unique(h, return_index=True, return_inverse=True)
        if any((w != w[first][klass]).any() for w in words):  # a hash collision: sort by the words themselves
            _, first, klass = np.unique(np.stack(words, axis=1), axis=0, return_index=True, return_inverse=True)
        klass = klass.reshape(-1)
        # Members class by class, each cheapest first (then by book row); a class's first member is its rep.
        members = np.lexsort((np.arange(n), cols["price"], klass))
        size_by_class = np.bincount(klass, minlength=len(first))
        start_by_class = np.concatenate(([0], np.cumsum(size_by_class)[:-1])).astype(np.int64)
        reps_rows = members[start_by_class]
        by_row = np.argsort(reps_rows)  # reps in book order (the order ties are broken by)
        return PrunedView(reps=self.subset(reps_rows[by_row]), size=size_by_class[by_row],
                          start=start_by_class[by_row], members=members)

    # ------------------------------------------------------------------ reading

    def gpu_code(self, name: str) -> int | None:
        """The code of GPU model ``name`` in this book, or None (spellings outside the table compared folded)."""
        code = self.gpus.index.get(name)
        if code is None:
            if self._folded_gpus is None:
                self._folded_gpus = {fold(n): i for i, n in enumerate(self.gpus.names)}
            code = self._folded_gpus.get(fold(name))
        return code

    def gpu_codes(self, names: Iterable[str]) -> np.ndarray:
        """Codes of the GPU models ``names`` that this book has."""
        return np.array([c for c in map(self.gpu_code, names) if c is not None], dtype=np.int32)

    def text(self, name: str, row: int) -> str:
        return self.codes[name].names[int(self.cols[name][row])]

    def texts(self, name: str, rows: np.ndarray) -> list[str]:
        """The text field ``name`` of each row in ``rows`` (one gather, not one lookup per row)."""
        names = self.codes[name].names
        return [names[c] for c in self.cols[name][rows].tolist()]

    def row(self, i: int) -> OfferRow:
        """A light view of row ``i`` (for reasons and options; no Offer made)."""
        return OfferRow(self, i)

    def offer(self, row: int) -> Offer:
        """Row ``row`` as an Offer: the original object when built from offers, else made from the columns."""
        if self.source is not None and self.order is not None:
            return self.source[int(self.order[row])]
        c = self.cols

        def t(name: str) -> str:
            return self.text(name, row)

        src = t("perf_source")
        perf = None
        if src != DATASHEET:
            perf = Perf(source=src, tflops_bf16=float(c["tflops"][row]),
                        allreduce_latency_us=float(c["fabric_lat"][row]))
        reliability = float(c["reliability"][row])
        down = float(c["inet_down_mbps"][row])
        attrs = {"nodes": ",".join(self.nodes[row])} if row in self.nodes else {}
        return Offer(
            id=self.ids[row], provider=t("provider"), market=MARKETS[c["market"][row]], sku=t("sku"),
            gpu=t("gpu"), gpu_count=int(c["gpu_count"][row]), gpu_memory_gb=float(c["gpu_mem"][row]),
            usd_per_hour=float(c["price"][row]), divisible=bool(c["divisible"][row]),
            interruptible=bool(c["interruptible"][row]), max_nodes=int(c["max_nodes"][row]),
            colocation=COLOCATIONS[c["coloc"][row]],
            locality=Locality(provider=t("site"), region=t("region"), zone=t("zone"), cluster=t("cluster"),
                              rack=t("rack"), host=t("host")),
            network=Network(intra=INTRAS[c["intra"][row]], fabric=FABRICS[c["fabric"][row]],
                            fabric_gbps=float(c["fabric_gbps"][row]),
                            inet_down_mbps=None if np.isnan(down) else down),
            reliability=None if np.isnan(reliability) else reliability, perf=perf,
            egress_usd_per_gb=float(c["egress"][row]), queue_wait_hours=float(c["queue"][row]),
            observed_at=datetime.fromtimestamp(float(c["observed_at"][row]), UTC), stale=bool(c["stale"][row]),
            source=SOURCES[c["source"][row]],
            attrs=attrs,
        )

    def nbytes(self) -> int:
        """Memory the book itself holds (columns, ids, interned text), not counting source offers."""
        total = sum(a.nbytes for a in self.cols.values())
        total += sum(len(i) + 57 for i in self.ids) + 8 * len(self.ids)  # str objects and the list
        total += sum(sum(len(n) + 57 for n in c.names) + 100 * len(c.names) for c in self.codes.values())
        return total
