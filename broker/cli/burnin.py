"""`lockstep burnin NODE`, `lockstep bench record FILE`, `lockstep bench list`: thin shells over the service's
nodes operations (broker/service/nodes.py, over broker.burnin).

Bad input exits with code 2 and one readable line on stderr; a provider failure exits with 1.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from broker.cli.app import get_ctx
from broker.cli.backend import local_only
from broker.cli.bench import read_text
from broker.cli.render import console
from broker.config import Settings
from broker.errors import EXIT_BAD_INPUT, LockstepError, SpecError
from broker.models import Benchmark, Fabric
from broker.service import Lockstep

configured = Lockstep.market_configured

T = TypeVar("T")


def _fail(line: str, code: int = EXIT_BAD_INPUT) -> None:
    typer.echo(f"lockstep: {line}", err=True)
    raise typer.Exit(code)


def _service(settings: Settings, provider: str | None) -> Lockstep:
    """The service with only the provider a command needs (none for store-only commands)."""
    if provider and configured(settings, provider):
        return Lockstep(settings, only_providers=[provider])
    return Lockstep(settings, providers={})


def _run(settings: Settings, provider: str | None, fn: Callable[[Lockstep], Awaitable[T]]) -> T:
    async def go() -> T:
        svc = _service(settings, provider)
        try:
            return await fn(svc)
        finally:
            await svc.aclose()

    try:
        return asyncio.run(go())
    except LockstepError as exc:
        _fail(str(exc), exc.exit_code)
    raise AssertionError("unreachable")  # pragma: no cover


def _fabric(value: str | None) -> Fabric | None:
    if value is None:
        return None
    try:
        return Fabric(value.strip().lower())
    except ValueError:
        _fail(f"--fabric {value!r}: use one of {', '.join(f.value for f in Fabric)}")
    return None  # pragma: no cover


def _doc(b: Benchmark) -> dict[str, Any]:
    """A benchmark for --json: every figure and the verdict; the raw probe document is left out."""
    doc = b.model_dump(mode="json", exclude={"raw"})
    doc["source"] = b.raw.get("source", "")
    for key in ("drain", "burnin", "fabric"):
        if key in b.raw:
            doc[key] = b.raw[key]
    return doc


def _num(x: float | None, fmt: str = "{:g}") -> str:
    return "" if x is None else fmt.format(x)


def _table(benches: list[Benchmark], unhealthy: dict[tuple[str, str], str]) -> None:
    t = Table()
    for col in ("provider", "target", "GPU", "#", "bf16 TFLOP/s", "mem GB/s", "busbw GB/s", "lat µs", "ECC DBE",
                "measured (UTC)", "health"):
        t.add_column(col, justify="right" if col not in ("provider", "target", "GPU", "health") else "left")
    for b in benches:
        health = "[green]healthy[/]" if b.healthy else f"[red]unhealthy[/]: {b.reason}"
        t.add_row(b.provider, b.target, b.gpu, str(b.gpu_count or ""), _num(b.tflops_bf16), _num(b.mem_bw_gbps),
                  _num(b.busbw_gbps), _num(b.allreduce_latency_us), str(b.ecc_double_bit),
                  b.measured_at.strftime("%Y-%m-%d %H:%M"), health)
    console.print(t)
    for (prov, node), reason in sorted(unhealthy.items()):
        console.print(f"[red]out of the pool[/]: {prov}/{node}: {reason}")


def _verdict(b: Benchmark) -> None:
    if b.healthy:
        console.print(f"{b.provider}/{b.target}: [green]healthy[/]")
        return
    drain = b.raw.get("drain") or {}
    how = "drained at the provider" if drain.get("drained") else f"not drained ({drain.get('why', '?')})"
    console.print(f"{b.provider}/{b.target}: [red]unhealthy[/], marked out of the pool and {how}: {b.reason}")


# --------------------------------------------------------------------------- commands


def burnin_command(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="Node to measure (a Slurm node name).")],
    provider: Annotated[str, typer.Option("--provider", help="Slurm provider the node belongs to.")] = "slurm",
    full: Annotated[bool, typer.Option("--full", help="Full-size measurements (minutes) instead of --quick.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=10, help="Seconds to wait for the probe job.")] = 300,
    json_out: Annotated[bool, typer.Option("--json", help="Print the stored benchmark as JSON.")] = False,
) -> None:
    """Burn a node in: run the probe there as a batch job, store the result, drain the node if unhealthy."""
    from broker.cli.progress import working

    c = get_ctx(ctx)
    local_only(c, "burnin")
    settings = c.settings
    if not configured(settings, provider):
        _fail(f"--provider {provider}: not configured (set LOCKSTEP_SLURM_URL and LOCKSTEP_SLURM_TOKEN)")
    with working(f"burning in {provider}/{node}: the probe runs there as a batch job (up to {timeout:g} s)"):
        b = _run(settings, provider,
                 lambda svc: svc.burn_in_node(provider, node, quick=not full, timeout_s=timeout))
    if json_out:
        typer.echo(json.dumps(_doc(b), indent=2))
        return
    _table([b], {})
    _verdict(b)


def record_command(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="A probe JSON document, or with --nccl nccl-tests output.")],
    provider: Annotated[str, typer.Option("--provider", help="Provider of the measured node or SKU.")],
    target: Annotated[str, typer.Option("--target", help="Host name or SKU that was measured.")],
    nccl: Annotated[bool, typer.Option("--nccl", help="FILE is nccl-tests output (all_reduce_perf ...).")] = False,
    fabric: Annotated[str | None, typer.Option(
        "--fabric", help="Fabric the run crossed (infiniband, efa, roce, ethernet): enables the latency gate.",
    )] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the stored benchmark as JSON.")] = False,
) -> None:
    """Store a benchmark, judged by the health gates; an unhealthy node leaves the pool (and is drained)."""
    local_only(get_ctx(ctx), "bench record")
    fab = _fabric(fabric)
    text = read_text(file)
    try:
        bench = Lockstep.benchmark_from_text(text, provider, target, nccl=nccl)
    except SpecError as exc:
        _fail(f"{file}: {exc.reason}")
    settings = get_ctx(ctx).settings
    b = _run(settings, provider, lambda svc: svc.record_benchmark(bench, fabric=fab))
    if json_out:
        typer.echo(json.dumps(_doc(b), indent=2))
        return
    _verdict(b)


def list_command(
    ctx: typer.Context,
    provider: Annotated[str | None, typer.Option("--provider", help="Only this provider.")] = None,
    target: Annotated[str | None, typer.Option("--target", help="Only this host or SKU.")] = None,
    history: Annotated[bool, typer.Option("--all", help="Every stored run, not only the latest per target.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="JSON: {benchmarks: [...], unhealthy: [...]}.")] = False,
) -> None:
    """Stored benchmarks (latest per provider and target) and the nodes out of the pool."""
    local_only(get_ctx(ctx), "bench list")
    settings = get_ctx(ctx).settings
    benches, unhealthy = _run(
        settings, None,
        lambda svc: svc.list_benchmarks(provider=provider, target=target, latest_only=not history),
    )
    if json_out:
        typer.echo(json.dumps({
            "benchmarks": [_doc(b) for b in benches],
            "unhealthy": [{"provider": p, "node": n, "reason": r} for (p, n), r in sorted(unhealthy.items())],
        }, indent=2))
        return
    if not benches and not unhealthy:
        console.print("no benchmarks stored (lockstep burnin NODE, or lockstep bench record FILE)")
        return
    _table(benches, unhealthy)


def resume_command(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="Node to put back in the pool.")],
    provider: Annotated[str, typer.Option("--provider", help="Provider the node belongs to.")] = "slurm",
    json_out: Annotated[bool, typer.Option("--json", help='Print {"provider", "node", "healthy": true}.')] = False,
) -> None:
    """Put a node back: healthy in the store, resumed at its provider (after a repair and a new burn-in)."""
    local_only(get_ctx(ctx), "bench resume")
    settings = get_ctx(ctx).settings
    _run(settings, provider, lambda svc: svc.resume_node(provider, node))
    if json_out:
        typer.echo(json.dumps({"provider": provider, "node": node, "healthy": True}, indent=2))
        return
    console.print(f"{provider}/{node}: back in the pool")


@functools.cache
def bench_group() -> typer.Typer:
    """`lockstep bench`: parse-nccl from broker/cli/bench.py; record, list and resume from here (they use the
    store)."""
    from broker.cli.bench import app as bench

    bench.command("record")(record_command)
    bench.command("list")(list_command)
    bench.command("resume")(resume_command)
    return bench
