"""Burn-in and benchmark recording: the service operations behind `lockstep burnin` and `lockstep bench`.

- :func:`record_benchmark` judges a benchmark with the health gates (``policies.health``), stores it
  with its verdict, and takes an unhealthy node out of the pool at once: it is marked unhealthy in the
  store (quotes reject it from the next call on) and drained at its provider (Slurm then schedules
  nothing new on it, and its offers disappear from the next refresh).
- :func:`burn_in` runs the node probe (``broker/probe.py``) as a job pinned to one node of a provider
  that runs burn-in (:class:`providers.capabilities.RunsBurnIn`: Slurm), waits for it, reads its JSON
  back from a results directory and records it.
- :func:`probe_script` is the piece of job script that does the measuring; the same lines can run in
  front of a user's command to make burn-in the first step of an allocation (see docs/benchmarks.md).

Every operation takes a :class:`BurnIn`: the settings, the store and the providers it uses, and the
node operations it calls (the service's drain and resume). The CLI and the API stay thin shells over
these functions.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import re
import secrets
import shlex
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker import probe as _probe
from broker.config import Settings
from broker.errors import NotFoundError, ProviderError, SpecError, TransientError
from broker.models import Allocation, AllocationState, Benchmark, Fabric
from broker.nccl import parse_nccl, to_benchmark
from policies.health import HealthThresholds, assess_with
from providers.base import Provider
from providers.capabilities import RunsBurnIn

if TYPE_CHECKING:
    from broker.store import Store

__all__ = [
    "BURNIN_TAG",
    "PROBE_EOF",
    "BurnIn",
    "benchmark_from_text",
    "burn_in",
    "burnin_command",
    "burnin_job_script",
    "collect_burnin",
    "job_stem",
    "list_benchmarks",
    "probe_script",
    "record_benchmark",
    "results_dir",
    "resume_node",
]

log = logging.getLogger(__name__)

# Comment tag of burn-in jobs. Deliberately not the owner tag: reconciliation would see an owner-tagged
# job that belongs to no Lockstep job as a leak and cancel it mid-measurement.
BURNIN_TAG = "lockstep:burnin"
PROBE_EOF = "LOCKSTEP_PROBE_EOF"
_TERMINAL = frozenset(
    {AllocationState.succeeded, AllocationState.failed, AllocationState.released, AllocationState.preempted}
)
_POLL_S = 1.0
_STEM = re.compile(r"[A-Za-z0-9._-]{1,120}")
_MAX_DRAIN_REASON = 200  # one readable line in `sinfo -R`; the full text is in the stored benchmark


@dataclass(frozen=True)
class BurnIn:
    """What burn-in and benchmark recording use, so that they need no service object.

    ``drain_node(provider, node, reason)`` takes a node out of the pool: marks it unhealthy in the
    store, so every quote rejects it at once, and drains it where its provider can; it answers
    ``{"drained": bool, ...}``. ``resume_node(provider, node)`` is its inverse. The service passes
    its own (they also forget its cached node health).
    """

    settings: Settings
    store: Store
    providers: Mapping[str, Provider]
    drain_node: Callable[[str, str, str], Awaitable[dict[str, Any]]]
    resume_node: Callable[[str, str], Awaitable[object]]

    async def db(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A blocking store call, off the event loop."""
        return await asyncio.to_thread(fn, *args)


# --------------------------------------------------------------------------- recording


def _drain_reason(reasons: list[str]) -> str:
    """One line for `sinfo -R`: ASCII, short, prefixed so operators see who drained the node."""
    text = "lockstep health: " + " ".join(reasons)
    text = text.replace("µ", "u").encode("ascii", "replace").decode("ascii")
    return text if len(text) <= _MAX_DRAIN_REASON else text[: _MAX_DRAIN_REASON - 3] + "..."


async def record_benchmark(ctx: BurnIn, b: Benchmark, *, fabric: Fabric | None = None) -> Benchmark:
    """Judge ``b`` with the health gates, store it with its verdict, and pull an unhealthy node.

    ``fabric`` is the inter-node fabric the measurement crossed (None for a single-node run, which the
    latency gate does not judge). An unhealthy target is marked unhealthy in the store and, when its
    provider drains nodes (Slurm), drained with the reason. A failed drain does not lose the benchmark:
    the outcome is kept under ``raw["drain"]``. Returns the stored benchmark.
    """
    thresholds = HealthThresholds.of(ctx.settings.health)
    healthy, reasons = assess_with(b, thresholds, gpu_model=b.gpu or None, fabric=fabric)
    raw = dict(b.raw)
    if fabric is not None:
        raw["fabric"] = Fabric(fabric).value
    if not healthy:
        raw["drain"] = await _pull_node(ctx, b.provider, b.target, _drain_reason(reasons))
    stored = b.model_copy(update={"healthy": healthy, "reason": " ".join(reasons), "raw": raw})
    await ctx.db(ctx.store.add_benchmark, stored)
    return stored


async def _pull_node(ctx: BurnIn, provider: str, node: str, reason: str) -> dict[str, Any]:
    if provider not in ctx.providers:
        # No offers of it in this market to reject; the mark still reaches other replicas and later runs.
        await ctx.db(ctx.store.set_node_health, provider, node, False, reason)
        return {"drained": False, "why": "provider not configured"}
    try:
        # The node operation marks the node in the store first (and forgets cached health, so the very
        # next quote rejects the node), then drains it at the provider.
        done = await ctx.drain_node(provider, node, reason)
    except ProviderError as exc:  # e.g. a SKU target, not a node: the store mark still applies
        log.warning("drain of %s on %s failed: %s", node, provider, exc)
        return {"drained": False, "why": str(exc)[:300]}
    if not done["drained"]:
        return {"drained": False, "why": "provider cannot drain nodes"}
    log.warning("drained %s on %s: %s", node, provider, reason)
    return {"drained": True, "reason": reason}


async def resume_node(ctx: BurnIn, provider: str, node: str) -> None:
    """Put a node back: healthy in the store, resumed at its provider where it drains nodes."""
    await ctx.resume_node(provider, node)


async def list_benchmarks(
    ctx: BurnIn, *, provider: str | None = None, target: str | None = None, latest_only: bool = True
) -> tuple[list[Benchmark], dict[tuple[str, str], str]]:
    """Stored benchmarks (newest first; one per provider and target with ``latest_only``) and the
    nodes currently marked unhealthy, (provider, node) → reason."""
    benches = await ctx.db(ctx.store.benchmarks, provider, target, latest_only)
    unhealthy = await ctx.db(ctx.store.unhealthy_nodes, provider)
    return benches, unhealthy


def benchmark_from_text(text: str, provider: str, target: str, *, nccl: bool = False) -> Benchmark:
    """A probe JSON document, or with ``nccl`` the text output of nccl-tests, as a Benchmark.

    SpecError (a readable reason) when the text is neither.
    """
    if not provider.strip() or not target.strip():
        raise SpecError("provider/target", "both are needed to say what was measured")
    if nccl:
        return to_benchmark(parse_nccl(text), provider, target)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(
            "probe JSON", f"not JSON (line {exc.lineno}: {exc.msg}); nccl-tests output needs --nccl"
        ) from None
    if not isinstance(doc, dict) or "probe_version" not in doc or not isinstance(doc.get("host"), dict):
        raise SpecError("probe JSON", "not a probe document (no probe_version/host): make one with `lockstep probe`")
    try:
        return _probe.benchmark_from_probe(doc, provider, target, gpus_required=True)
    except (TypeError, ValueError, AttributeError) as exc:  # a hand-edited document with wrong types
        raise SpecError("probe JSON", f"malformed probe document ({type(exc).__name__}: {exc})"[:300]) from None


# --------------------------------------------------------------------------- the job script


@functools.cache
def probe_source() -> str:
    """The probe's own source: stdlib-only, so it runs on any node with Python 3.9+ (read once)."""
    text = Path(_probe.__file__).read_text(encoding="utf-8")
    if PROBE_EOF in text:  # the heredoc would end early
        raise AssertionError(f"{PROBE_EOF} appears in probe.py")
    return text


def probe_script(result_dir: str, stem: str, *, quick: bool = True) -> str:
    """Bash lines that write the probe to a temp file, run it, and leave its JSON in ``result_dir``
    as ``<stem>-<node>.json`` (node: ``$SLURMD_NODENAME``, else the short host name).

    The JSON appears atomically (written aside, then renamed), so a reader never sees half a document.
    The lines keep the probe's exit status in ``LOCKSTEP_PROBE_RC`` and never exit themselves, so they
    can precede a user's command in the same script (:func:`burnin_command`).
    """
    if not _STEM.fullmatch(stem):
        raise SpecError("stem", f"{stem!r}: use letters, digits, '.', '_' or '-'")
    out = f'{shlex.quote(result_dir)}/{stem}-"${{SLURMD_NODENAME:-$(hostname -s)}}".json'
    return "\n".join(
        [
            "# --- Lockstep burn-in: measure this node before anything else runs on it",
            f"mkdir -p {shlex.quote(result_dir)}",
            'LOCKSTEP_PROBE="$(mktemp "${TMPDIR:-/tmp}/lockstep-probe-XXXXXX.py")"',
            f"cat >\"$LOCKSTEP_PROBE\" <<'{PROBE_EOF}'",
            probe_source().rstrip("\n"),
            PROBE_EOF,
            'LOCKSTEP_PY="$(command -v python3 || command -v python)"',
            f'LOCKSTEP_OUT={out}',
            f"\"$LOCKSTEP_PY\" \"$LOCKSTEP_PROBE\" {'--quick' if quick else ''} >\"$LOCKSTEP_OUT.part\" "
            '&& mv -f "$LOCKSTEP_OUT.part" "$LOCKSTEP_OUT"',
            "LOCKSTEP_PROBE_RC=$?",
            'rm -f "$LOCKSTEP_PROBE"',
            "# --- end of burn-in",
        ]
    )


def burnin_job_script(result_dir: str, stem: str, *, quick: bool = True) -> str:
    """A whole batch script that only measures (``lockstep burnin``); exits with the probe's status."""
    return "#!/bin/bash\n# Lockstep burn-in probe\n" + probe_script(result_dir, stem, quick=quick) + (
        "\nexit $LOCKSTEP_PROBE_RC\n"
    )


def job_stem(job_id: str, attempt: int) -> str:
    """Result-file stem of the burn-in step of one attempt of a Lockstep job."""
    return f"job-{job_id}-{attempt}"


def burnin_command(command: str, *, result_dir: str, stem: str, quick: bool = True) -> str:
    """The user's ``command`` with the probe run first: burn-in as the first step of an allocation.

    The probe's failure does not stop the user's command; the broker judges the result it left
    (:func:`collect_burnin`) and pulls the node if it is unhealthy. An empty command holds the
    allocation (``sleep`` until the time limit), as a job without a command does on Slurm. The probe
    runs on the batch host, the first node of the allocation.
    """
    return probe_script(result_dir, stem, quick=quick) + "\n" + (command.strip() or "exec sleep infinity")


def _results(directory: Path, stem: str) -> list[tuple[Path, str, Any]]:
    """(file, node, parsed JSON or None when unreadable) for each result of ``stem``; blocking I/O."""
    out: list[tuple[Path, str, Any]] = []
    for path in sorted(directory.glob(f"{stem}-*.json")):
        node = path.name[len(stem) + 1 : -len(".json")]
        try:
            out.append((path, node, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError) as exc:
            log.warning("burn-in result %s unreadable: %s", path, type(exc).__name__)
            out.append((path, node, None))
    return out


async def collect_burnin(ctx: BurnIn, provider: str, stem: str) -> list[Benchmark]:
    """Record every result a burn-in step with ``stem`` has left so far, one per node; each file is
    removed once stored, so calling this on every poll stores each result once."""
    out: list[Benchmark] = []
    for path, node, doc in await asyncio.to_thread(_results, results_dir(ctx), stem):
        try:
            b = _probe.benchmark_from_probe(doc, provider, node) if isinstance(doc, dict) else None
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("burn-in result %s malformed: %s", path, type(exc).__name__)
            b = None
        if b is None:
            continue  # left in place for an operator to look at
        b.raw["burnin"] = {"node": node, "stem": stem}
        out.append(await record_benchmark(ctx, b))
        await asyncio.to_thread(path.unlink, missing_ok=True)
    return out


def results_dir(ctx: BurnIn) -> Path:
    return results_path(ctx.settings)


def results_path(settings: Settings) -> Path:
    """Where burn-in steps leave their JSON (``health.burnin_results_dir``, else a temp dir)."""
    configured = settings.health.burnin_results_dir
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "lockstep-burnin"


# --------------------------------------------------------------------------- burn-in of one node


def _runner(ctx: BurnIn, provider: str) -> RunsBurnIn:
    prov = ctx.providers.get(provider)
    if prov is None:
        raise NotFoundError(f"provider {provider} not configured")
    if not isinstance(prov, RunsBurnIn):
        raise SpecError("provider", f"burn-in runs as a batch job pinned to a node; {provider} cannot run one")
    return prov


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])[:400]


async def _wait_for_result(
    prov: RunsBurnIn, alloc: Allocation, result: Path, log_path: Path, timeout_s: float
) -> None:
    """Poll the job until its result file appears; raise if it ends without one or takes too long."""
    job_id, node = alloc.resource_ids[0], alloc.job_id.removeprefix("burnin-")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    # File checks off the event loop: on a shared filesystem a stat can block.
    while not await asyncio.to_thread(result.exists):
        status = await prov.poll(alloc)
        if status.state in _TERMINAL or status.state is AllocationState.unknown:
            # The file is renamed into place before the job ends; one last look settles a close race.
            if await asyncio.to_thread(result.exists):
                return
            tail = await asyncio.to_thread(_tail, log_path)
            raise ProviderError(
                prov.name, f"burn-in job {job_id} on {node} ended ({status.reason}) without a result"
                + (f": {tail}" if tail else f" (expected {result}: is {result.parent} shared with the node?)"),
            )
        if loop.time() > deadline:
            raise TransientError(prov.name, f"burn-in job {job_id} on {node} did not finish in {timeout_s:g} s "
                                            f"(last state: {status.reason}); cancelled")
        await asyncio.sleep(_POLL_S)


async def burn_in(
    ctx: BurnIn,
    provider: str,
    node: str,
    *,
    quick: bool = True,
    timeout_s: float = 300,
    gpus: int | None = None,
) -> Benchmark:
    """Run the probe on ``node`` as a job pinned to it (a Slurm batch job), wait for it, record the result.

    The job takes all the node's GPUs unless ``gpus`` says otherwise (a burn-in measures the whole
    node), is pinned to it, and writes its JSON under :func:`results_dir` (a shared filesystem on a
    real cluster). Raises SpecError for an unknown or unavailable node, TransientError when the job
    does not finish within ``timeout_s`` (it is cancelled), ProviderError when it fails.
    """
    prov = _runner(ctx, provider)
    nodes = {n.name: n for n in await prov.list_nodes()}
    info = nodes.get(node)
    if info is None:
        known = ", ".join(sorted(nodes)[:20])
        raise SpecError("node", f"{node!r} is not a node of {provider} (known: {known})")
    if not info.healthy:
        raise SpecError("node", f"{node} is {info.state}: nothing starts there; resume it first to burn it in")
    want = info.gpus_total if gpus is None else gpus
    if want < 0 or want > info.gpus_total:
        raise SpecError("gpus", f"{node} has {info.gpus_total} GPU(s), {want} asked")

    token = secrets.token_hex(6)
    out_dir = results_dir(ctx)
    stem = f"burnin-{token}"
    result = out_dir / f"{stem}-{node}.json"
    log_path = out_dir / f"{stem}.log"
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = {BURNIN_TAG: prov.installation, "lockstep:node": node, "lockstep:token": token}
    limit_min = max(2, math.ceil(timeout_s / 60) + 1)
    alloc = await prov.run_on_node(node, burnin_job_script(str(out_dir), stem, quick=quick), gpus=want,
                                   time_limit_min=limit_min, log_path=str(log_path), labels=labels)
    job_id = alloc.resource_ids[0]
    log.info("burn-in of %s: job %s", node, job_id)

    try:
        await _wait_for_result(prov, alloc, result, log_path, timeout_s)
    except BaseException:
        # Timed out, interrupted (Ctrl-C) or failed: leave no probe job behind holding the node's GPUs.
        try:
            await asyncio.shield(prov.release(alloc))
        except ProviderError as exc:
            log.warning("cancelling burn-in job %s failed: %s", job_id, exc)
        raise

    try:
        doc = json.loads(await asyncio.to_thread(result.read_text, encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ProviderError(provider, f"burn-in result {result} unreadable ({type(exc).__name__})") from None
    b = _probe.benchmark_from_probe(doc, provider, node)
    b.raw["burnin"] = {"slurm_job_id": job_id, "node": node, "quick": quick}
    recorded = await record_benchmark(ctx, b)
    for path in (result, log_path):  # stored now; the store is the record
        await asyncio.to_thread(path.unlink, missing_ok=True)
    return recorded
