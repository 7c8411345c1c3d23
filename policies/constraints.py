"""Hard constraints: which offers can run a job at all, and why the others cannot.

Every rejected offer gets the code of the *first* constraint it breaks, in the
order of ``CHECKS`` (most fundamental first, so the reason a user reads is the
one that matters); ``describe`` turns a code back into a sentence with the
offer's own numbers.

:func:`screen` works in two stages over the book's index (policies/book.py):
the checks that depend only on a group's key (provider, market, region, GPU
model, runtime) run once per group; the others run only over the rows of the
groups that pass. Rejections are *counted* for every offer, but written out
only for the rows a caller shows. Pure and vectorised: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from broker.gpus import GPU_SPECS, Runtime, Vendor
from broker.models import COLOCATE_RANK, FabricNeed, JobSpec, Market
from broker.perf import min_gpu_memory_gb
from policies.book import FABRICS, MARKETS, OWNED, VENDORS, GroupScreen, OfferBook, OfferRow


@dataclass(frozen=True, slots=True)
class Check:
    code: str
    describe: Callable[[OfferRow, JobSpec], str]


def _job_node_price(o: OfferRow, spec: JobSpec) -> float:
    assert spec.gpus_per_node is not None
    return o.usd_per_hour / max(o.gpu_count, 1) * spec.gpus_per_node if o.divisible else o.usd_per_hour


def _runtime_reason(o: OfferRow, s: JobSpec) -> str:
    gpu = GPU_SPECS.get(o.gpu)
    needs = gpu.runtime.value if gpu else "?"
    return f"GPU {o.gpu} needs a {needs} image; the job's image is built for {s.runtime.value if s.runtime else '?'}"


CHECKS: tuple[Check, ...] = (
    Check("provider", lambda o, s: (
        "job must stay on-prem (onprem_only / cloud_ok: false)" if (s.onprem_only or not s.cloud_ok)
        else f"provider {o.provider} not in the job's providers {s.providers}")),
    Check("market", lambda o, s: f"market {o.market.value} not allowed (job allows "
                                 f"{', '.join(m.value for m in s.markets)})"),
    Check("region", lambda o, s: f"region {o.region or '?'} not in {s.regions}"),
    Check("unhealthy", lambda o, s: "node marked unhealthy"),
    Check("gpu_model", lambda o, s: f"GPU {o.gpu} not accepted (job accepts {', '.join(s.gpu)})"),
    Check("runtime", _runtime_reason),
    Check("image", lambda o, s: "no container runtime here for the job's image (the pool runs commands on its "
                                "hosts): drop `image`, or use a pool with one (pyxis, apptainer)"),
    Check("gpu_memory", lambda o, s: f"{o.gpu_memory_gb:g} GB per GPU < {memory_needed(s):g} GB needed" + (
        "" if memory_needed(s) <= s.min_gpu_memory_gb else
        f" ({s.workload.params_b if s.workload else 0:g}B parameters in bf16 over {s.gpus} GPUs)")),
    Check("gpus_per_node", lambda o, s: f"{o.gpu_count} GPUs per node available < {s.gpus_per_node} needed"),
    Check("nodes", lambda o, s: f"only {o.max_nodes} node(s) to be had together, job needs {s.nodes}"),
    Check("colocation", lambda o, s: f"nodes co-located only at '{o.colocation.value}' level, job needs "
                                     f"'{s.colocate.value}'"),
    Check("fabric", lambda o, s: f"fabric {o.fabric.value} does not meet '{s.fabric.value}'"),
    Check("fabric_bandwidth", lambda o, s: f"fabric {o.fabric_gbps:g} Gbit/s < "
                                           f"{s.min_fabric_gbps:g} Gbit/s needed"),
    Check("reliability", lambda o, s: f"reliability {o.reliability} < {s.min_reliability}"),
    Check("interruptible", lambda o, s: "interruptible (spot) capacity, job does not tolerate preemption"),
    Check("price_cap", lambda o, s: f"${_job_node_price(o, s) * s.nodes:,.2f}/h over the cap "
                                    f"${s.max_usd_per_hour:,.2f}/h"),
    # The two below need the cost model; ranking applies them after estimating.
    Check("budget", lambda o, s: f"expected cost over the job's cap ${s.max_total_usd:,.0f}"),
    Check("deadline", lambda o, s: "would finish after the deadline"),
)
CODE_OF: dict[str, int] = {c.code: i + 1 for i, c in enumerate(CHECKS)}
MAX_RUNS = 32  # up to this many stretches of candidate rows, columns are sliced rather than gathered
_FABRIC_OK: dict[FabricNeed, np.ndarray] = {
    need: np.array([need.accepts(f) for f in FABRICS], dtype=bool) for need in FabricNeed
}
# Per vendor code (0: unknown to the GPU table, let through), the runtimes that run on it.
_RUNTIME_OK: dict[Runtime, np.ndarray] = {
    r: np.array([v is None or (v is Vendor.nvidia) == (r is Runtime.cuda) for v in VENDORS], dtype=bool)
    for r in (Runtime.cuda, Runtime.rocm)
}


def memory_needed(spec: JobSpec) -> float:
    """GB per GPU the job needs: what it asks, or more when its model cannot fit otherwise."""
    if spec.workload is None:
        return spec.min_gpu_memory_gb
    return max(spec.min_gpu_memory_gb, min_gpu_memory_gb(spec.workload, spec.gpus))


def job_node_price(book: OfferBook, spec: JobSpec, idx: np.ndarray | None = None) -> np.ndarray:
    """Price per node-hour for this job: divisible (owned) nodes are paid per GPU taken."""
    assert spec.gpus_per_node is not None
    if idx is None:
        if not book.any_divisible:
            return book["price"]
        return np.where(book["divisible"], book["price_per_gpu"] * spec.gpus_per_node, book["price"])
    price: np.ndarray = book["price"][idx]
    if not book.any_divisible:
        return price
    return np.where(book["divisible"][idx], book["price_per_gpu"][idx] * spec.gpus_per_node, price)


def _assign(codes: np.ndarray, fails: list[tuple[str, np.ndarray]]) -> None:
    # Reverse order, so the first check in CHECKS order wins. A masked write costs more than a scan, and
    # most checks break no offer that got this far: write only where one does.
    for code, mask in reversed(fails):
        if mask.any():
            codes[mask] = CODE_OF[code]


def _first_nonzero(a: np.ndarray, limit: int | None) -> np.ndarray:
    """Positions of the first ``limit`` non-zero entries (all when None), scanning only as far as needed."""
    if limit is None:
        return np.flatnonzero(a)
    found: list[np.ndarray] = []
    start, step = 0, max(4 * limit, 1024)
    while start < len(a) and sum(map(len, found)) < limit:
        found.append(np.flatnonzero(a[start:start + step]) + start)
        start, step = start + step, step * 4
    return np.concatenate(found)[:limit] if found else np.zeros(0, dtype=np.int64)


@dataclass
class Screen:
    """What the constraints say about a book for one job.

    ``rows``: the rows of the groups that passed the group checks (book order);
    ``codes``: per such row, 0 when feasible, else its first broken check (the
    ranking adds budget and deadline); ``group_codes``: per group, 0 when its rows
    are in ``rows``, else the check the whole group breaks.
    """

    book: OfferBook
    rows: np.ndarray
    codes: np.ndarray
    group_codes: np.ndarray
    # Rows outside ``rows`` whose code is not their group's: unhealthy nodes in groups rejected by a
    # check that comes after health (GPU model, runtime). Few: only unhealthy rows can be here.
    unhealthy_elsewhere: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Per check, the offers of the groups it rejects (:meth:`group_counts`): kept with a remembered screen.
    group_freq: np.ndarray | None = None

    def group_counts(self) -> np.ndarray:
        """Per code, how many offers the group checks rejected with it (the groups' sizes summed)."""
        if self.group_freq is None:
            self.group_freq = np.bincount(self.group_codes, weights=self.book.groups.size,
                                          minlength=len(CHECKS) + 1).astype(np.int64)
        return self.group_freq

    def counts(self) -> dict[str, int]:
        """How many offers each check rejected (every offer counted, none written out)."""
        freq = np.bincount(self.codes, minlength=len(CHECKS) + 1)
        freq[: len(CHECKS) + 1] += self.group_counts()
        moved = self.unhealthy_elsewhere
        if len(moved):
            np.subtract.at(freq, self.group_codes[self.book.groups.of_rows(moved)], 1)
            freq[CODE_OF["unhealthy"]] += len(moved)
        per_code = freq.tolist()  # Python ints at once: indexing the array makes a numpy scalar per code
        return {CHECKS[v - 1].code: per_code[v] for v in range(1, len(per_code)) if per_code[v]}

    def rejected(self, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(rows, codes) of up to ``limit`` rejected offers: the near misses (the right GPU in an
        allowed market, broken on a later check) first, then the others in book order."""
        near = _first_nonzero(self.codes, limit)
        rows, codes = self.rows[near], self.codes[near]
        room = None if limit is None else limit - len(rows)
        if room is not None and room <= 0:
            return rows, codes
        groups = self.book.groups
        bad = np.flatnonzero(self.group_codes)
        if room is not None:  # only as many groups as it takes to fill the room
            bad = bad[: int(np.searchsorted(np.cumsum(groups.size[bad]), room)) + 1]
        which = np.zeros(len(groups), dtype=bool)
        which[bad] = True
        far = groups.rows(which)[:room]
        far_codes = np.repeat(self.group_codes[which], groups.size[which])[:room]
        if len(self.unhealthy_elsewhere):
            far_codes[np.isin(far, self.unhealthy_elsewhere)] = CODE_OF["unhealthy"]
        return np.concatenate((rows, far)), np.concatenate((codes, far_codes))

    def all_codes(self) -> np.ndarray:
        """Per book row: 0 when feasible, else its first broken check."""
        out = np.repeat(self.group_codes, self.book.groups.size)
        out[self.rows] = self.codes
        out[self.unhealthy_elsewhere] = CODE_OF["unhealthy"]
        return out


def _group_checks(book: OfferBook, spec: JobSpec) -> np.ndarray:
    g = book.groups
    fails: list[tuple[str, np.ndarray]] = []
    if spec.providers or spec.onprem_only or not spec.cloud_ok:
        allowed = np.ones(len(g), dtype=bool)
        if spec.providers:
            allowed &= book.providers.table(spec.providers)[g.provider]
        if spec.onprem_only or not spec.cloud_ok:
            allowed &= g.market == OWNED
        fails.append(("provider", ~allowed))
    if len(spec.markets) < len(MARKETS):
        market_ok = np.zeros(len(MARKETS), dtype=bool)
        market_ok[[MARKETS.index(Market(m)) for m in spec.markets]] = True
        fails.append(("market", ~market_ok[g.market]))
    if spec.regions:
        fails.append(("region", ~book.regions.table(spec.regions)[g.region]))
    if spec.gpu:
        gpu_ok = np.zeros(max(len(book.gpus), 1), dtype=bool)
        gpu_ok[book.gpu_codes(spec.gpu)] = True
        fails.append(("gpu_model", ~gpu_ok[g.gpu]))
    if spec.runtime in _RUNTIME_OK:
        fails.append(("runtime", ~_RUNTIME_OK[spec.runtime][book.gpu_vendor][g.gpu]))
    codes = np.zeros(len(g), dtype=np.int8)
    _assign(codes, fails)
    return codes


def _group_key(spec: JobSpec) -> tuple[object, ...]:
    """What the group checks read of a job: equal keys, equal verdicts on one book."""
    return (tuple(spec.providers or ()), spec.onprem_only, spec.cloud_ok, tuple(spec.markets),
            tuple(spec.regions or ()), tuple(spec.gpu), spec.runtime)


GROUP_MEMO_SIZE = 256  # job keys remembered per book (a key's verdict is a few hundred bytes to a few KB)
MEMO_MAX_ROWS = 65_536  # candidate rows kept with a key's verdict: at most 512 KB each


def _group_screen(book: OfferBook, spec: JobSpec) -> GroupScreen:
    """The group checks' verdict for ``spec``, worked out once per job key and book: on a small book their
    fixed cost (a dozen numpy calls over a few hundred groups) is a third of a quote's screen, and most new
    specs differ from an earlier one only in fields the group checks do not read (name, workload, size)."""
    key = _group_key(spec)
    memo = book._group_memo
    hit = memo.get(key)
    if hit is None:
        codes = _group_checks(book, spec)
        which = codes == 0
        runs = book.groups.runs(which)
        rows = None
        if int(book.groups.size[which].sum()) <= MEMO_MAX_ROWS:
            rows = _rows_of(book, runs, which)
            rows.setflags(write=False)
        codes.setflags(write=False)
        hit = GroupScreen(codes, runs, rows)
        if len(memo) >= GROUP_MEMO_SIZE:
            memo.clear()
        memo[key] = hit
    return hit


def _rows_of(book: OfferBook, runs: list[tuple[int, int]], which: np.ndarray) -> np.ndarray:
    if len(runs) <= MAX_RUNS:
        return np.concatenate([np.arange(a, b) for a, b in runs]) if runs else np.zeros(0, dtype=np.int64)
    return book.groups.rows(which)


def group_checks(book: OfferBook, spec: JobSpec) -> np.ndarray:
    """Per index group: 0 when its rows go on to the row checks, else the check the whole group breaks
    (what :func:`screen` starts from; read-only, shared by the quotes of one job key on this book)."""
    return _group_screen(book, spec).codes


def _row_key(spec: JobSpec, members: bool) -> tuple[object, ...]:
    """What :func:`screen` reads of a job, the group checks' key included: equal keys, equal screens on one
    book version (health included)."""
    return (_group_key(spec), members, spec.image is not None, memory_needed(spec), spec.gpus_per_node, spec.nodes,
            spec.colocate, spec.fabric, spec.min_fabric_gbps, spec.min_reliability, spec.interruptible,
            spec.max_usd_per_hour)


def screen(book: OfferBook, spec: JobSpec, *, members: bool = False) -> Screen:
    """The constraints over ``book``: group checks on the index, row checks on the rows that remain.

    ``members``: screen rows as single machines of an assembly (policies/assembly.py): the node count,
    co-location and price cap are the assembly's to meet, not each machine's. The group checks' verdict is
    remembered per job key on the book (:func:`group_checks` hands out the same); the whole screen per
    :func:`_row_key` on the book version (a dozen numpy calls that specs differing only in name, workload,
    data or command would each repeat). The caller owns the codes it gets (the ranking adds to them)."""
    assert spec.gpus_per_node is not None
    key = _row_key(spec, members)
    memo = book._screen_memo
    kept: Screen | None = memo.get(key)
    if kept is None:
        fresh = _screen(book, spec, members)
        if len(fresh.rows) <= MEMO_MAX_ROWS:
            if len(memo) >= GROUP_MEMO_SIZE:
                memo.clear()
            codes = fresh.codes.copy()
            codes.setflags(write=False)
            group_freq = fresh.group_counts()
            group_freq.setflags(write=False)
            memo[key] = Screen(book, fresh.rows, codes, fresh.group_codes, fresh.unhealthy_elsewhere, group_freq)
        return fresh
    return Screen(book, kept.rows, kept.codes.copy(), kept.group_codes, kept.unhealthy_elsewhere, kept.group_freq)


def _screen(book: OfferBook, spec: JobSpec, members: bool) -> Screen:
    assert spec.gpus_per_node is not None
    verdict = _group_screen(book, spec)
    group_codes, runs = verdict.codes, verdict.runs
    if len(runs) <= MAX_RUNS:  # a few stretches of rows: slices (views, or one copy each), no gathers
        rows = verdict.rows if verdict.rows is not None else _rows_of(book, runs, group_codes == 0)

        def col(name: str) -> np.ndarray:
            column = book[name]
            return column[runs[0][0]:runs[0][1]] if len(runs) == 1 else np.concatenate(
                [column[a:b] for a, b in runs] or [column[:0]])
    else:
        rows = verdict.rows if verdict.rows is not None else book.groups.rows(group_codes == 0)

        def col(name: str) -> np.ndarray:
            picked: np.ndarray = book[name][rows]
            return picked

    nodes = spec.nodes
    fails: list[tuple[str, np.ndarray]] = []
    if book.any_unhealthy:
        fails.append(("unhealthy", col("unhealthy")))
    if spec.image is not None:
        fails.append(("image", col("no_image")))
    if need := memory_needed(spec):
        fails.append(("gpu_memory", col("gpu_mem") + 1e-9 < need))
    fails.append(("gpus_per_node", col("gpu_count") < spec.gpus_per_node))
    if nodes > 1 and not members:
        fails.append(("nodes", col("max_nodes") < nodes))
        fails.append(("colocation", col("coloc") > COLOCATE_RANK[spec.colocate]))
    if spec.fabric is not FabricNeed.any:
        fails.append(("fabric", ~_FABRIC_OK[spec.fabric][col("fabric")]))
    if spec.min_fabric_gbps and (nodes > 1 or spec.fabric is not FabricNeed.any):
        fails.append(("fabric_bandwidth", col("fabric_gbps") + 1e-9 < spec.min_fabric_gbps))
    if spec.min_reliability:
        fails.append(("reliability", col("reliability") < spec.min_reliability))  # unknown (NaN) passes
    if not spec.interruptible:
        fails.append(("interruptible", col("interruptible")))
    if spec.max_usd_per_hour is not None and not members:
        price = col("price") if not book.any_divisible else np.where(
            col("divisible"), col("price_per_gpu") * spec.gpus_per_node, col("price"))
        fails.append(("price_cap", price * nodes > spec.max_usd_per_hour + 1e-9))
    codes = np.zeros(len(rows), dtype=np.int8)
    _assign(codes, fails)
    elsewhere = np.zeros(0, dtype=np.int64)
    if book.any_unhealthy:  # health is checked before the GPU model: a drained node says so whatever the job
        bad = book.unhealthy_rows
        elsewhere = bad[group_codes[book.groups.of_rows(bad)] > CODE_OF["unhealthy"]]
    return Screen(book, rows, codes, group_codes, elsewhere)


def reject_codes(book: OfferBook, spec: JobSpec) -> np.ndarray:
    """0 for feasible offers, else the code of the first broken constraint (every row of the book)."""
    return screen(book, spec).all_codes()


def describe(code: int, offer: OfferRow, spec: JobSpec) -> tuple[str, str]:
    """(machine code, readable reason) for a rejection code, about a book row (``OfferBook.row``)."""
    check = CHECKS[code - 1]
    return check.code, check.describe(offer, spec)
