"""Hard constraints: which offers can run a job at all, and why the others cannot.

``reject_codes`` returns one small integer per offer: 0 when the offer is
feasible, otherwise the code of the *first* constraint it breaks, in the order
of ``CHECKS`` (most fundamental first, so the reason a user reads is the one
that matters). ``describe`` turns a code back into a sentence with the
offer's own numbers. Pure and vectorised: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from broker.models import COLOCATE_RANK, FabricNeed, JobSpec, Market, Offer
from policies.book import FABRICS, MARKETS, OfferBook


@dataclass(frozen=True, slots=True)
class Check:
    code: str
    describe: Callable[[Offer, JobSpec], str]


def _job_node_price(o: Offer, spec: JobSpec) -> float:
    assert spec.gpus_per_node is not None
    return o.usd_per_hour / max(o.gpu_count, 1) * spec.gpus_per_node if o.divisible else o.usd_per_hour


CHECKS: tuple[Check, ...] = (
    Check("provider", lambda o, s: (
        "job must stay on-prem (onprem_only / cloud_ok: false)" if (s.onprem_only or not s.cloud_ok)
        else f"provider {o.provider} not in the job's providers {s.providers}")),
    Check("market", lambda o, s: f"market {o.market.value} not allowed (job allows "
                                 f"{', '.join(m.value for m in s.markets)})"),
    Check("region", lambda o, s: f"region {o.region or '?'} not in {s.regions}"),
    Check("unhealthy", lambda o, s: "node marked unhealthy"),
    Check("gpu_model", lambda o, s: f"GPU {o.gpu} not accepted (job accepts {', '.join(s.gpu)})"),
    Check("gpu_memory", lambda o, s: f"{o.gpu_memory_gb:g} GB per GPU < {s.min_gpu_memory_gb:g} GB needed"),
    Check("gpus_per_node", lambda o, s: f"{o.gpu_count} GPUs per node available < {s.gpus_per_node} needed"),
    Check("nodes", lambda o, s: f"only {o.max_nodes} node(s) to be had together, job needs {s.nodes}"),
    Check("colocation", lambda o, s: f"nodes co-located only at '{o.colocation.value}' level, job needs "
                                     f"'{s.colocate.value}'"),
    Check("fabric", lambda o, s: f"fabric {o.network.fabric.value} does not meet '{s.fabric.value}'"),
    Check("fabric_bandwidth", lambda o, s: f"fabric {o.network.fabric_gbps:g} Gbit/s < "
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


def _fabric_ok(need: FabricNeed) -> np.ndarray:
    return np.array([need.accepts(f) for f in FABRICS], dtype=bool)


def _lookup(size: int, allowed: np.ndarray) -> np.ndarray:
    """A boolean table indexed by code: faster than np.isin on every quote."""
    table = np.zeros(max(size, 1), dtype=bool)
    table[allowed] = True
    return table


def job_node_price(book: OfferBook, spec: JobSpec, idx: np.ndarray | None = None) -> np.ndarray:
    """Price per node-hour for this job: divisible (owned) nodes are paid per GPU taken."""
    assert spec.gpus_per_node is not None
    if idx is None:
        return np.where(book["divisible"], book["price_per_gpu"] * spec.gpus_per_node, book["price"])
    return np.where(book["divisible"][idx], book["price_per_gpu"][idx] * spec.gpus_per_node, book["price"][idx])


def _assign(codes: np.ndarray, fails: list[tuple[str, np.ndarray]]) -> None:
    # Reverse order, so the first check in CHECKS order wins.
    for code, mask in reversed(fails):
        codes[mask] = CODE_OF[code]


def reject_codes(book: OfferBook, spec: JobSpec) -> np.ndarray:
    """0 for feasible offers, else the code of the first broken constraint.

    Two stages: the cheap, selective checks (provider, market, region, health,
    GPU model) run over the whole book; the rest only over the survivors.
    """
    n = len(book)
    codes = np.zeros(n, dtype=np.int8)
    if n == 0:
        return codes
    nodes = spec.nodes
    assert spec.gpus_per_node is not None

    fails: list[tuple[str, np.ndarray]] = []
    if spec.providers or spec.onprem_only or not spec.cloud_ok:
        allowed = np.ones(n, dtype=bool)
        if spec.providers:
            allowed &= _lookup(len(book.providers.names), book.providers.codes_of(spec.providers))[book["provider"]]
        if spec.onprem_only or not spec.cloud_ok:
            allowed &= book["market"] == MARKETS.index(Market.owned)
        fails.append(("provider", ~allowed))
    market_ok = np.zeros(len(MARKETS), dtype=bool)
    for m in spec.markets:
        market_ok[MARKETS.index(m)] = True
    if not market_ok.all():
        fails.append(("market", ~market_ok[book["market"]]))
    if spec.regions:
        fails.append(("region", ~_lookup(len(book.regions.names), book.regions.codes_of(spec.regions))[book["region"]]))
    fails.append(("unhealthy", book["unhealthy"]))
    fails.append(("gpu_model", ~_lookup(len(book.gpus.names), book.gpus.codes_of(spec.gpu))[book["gpu"]]))
    _assign(codes, fails)

    cand = np.flatnonzero(codes == 0)
    col = {name: book[name][cand] for name in ("gpu_mem", "gpu_count", "max_nodes", "coloc", "fabric",
                                                 "fabric_gbps", "reliability", "interruptible")}
    fails = []
    if spec.min_gpu_memory_gb:
        fails.append(("gpu_memory", col["gpu_mem"] + 1e-9 < spec.min_gpu_memory_gb))
    fails.append(("gpus_per_node", col["gpu_count"] < spec.gpus_per_node))
    if nodes > 1:
        fails.append(("nodes", col["max_nodes"] < nodes))
        fails.append(("colocation", col["coloc"] > COLOCATE_RANK[spec.colocate]))
    if spec.fabric is not FabricNeed.any:
        fails.append(("fabric", ~_fabric_ok(spec.fabric)[col["fabric"]]))
    if spec.min_fabric_gbps and (nodes > 1 or spec.fabric is not FabricNeed.any):
        fails.append(("fabric_bandwidth", col["fabric_gbps"] + 1e-9 < spec.min_fabric_gbps))
    if spec.min_reliability:
        fails.append(("reliability", col["reliability"] < spec.min_reliability))
    if not spec.interruptible:
        fails.append(("interruptible", col["interruptible"]))
    if spec.max_usd_per_hour is not None:
        fails.append(("price_cap", job_node_price(book, spec, cand) * nodes > spec.max_usd_per_hour + 1e-9))
    sub = np.zeros(len(cand), dtype=np.int8)
    _assign(sub, fails)
    codes[cand] = sub
    return codes


def describe(code: int, offer: Offer, spec: JobSpec) -> tuple[str, str]:
    """(machine code, readable reason) for a rejection code."""
    check = CHECKS[code - 1]
    return check.code, check.describe(offer, spec)
