"""`lockstep simulate deadline|cluster` and `lockstep advise`: thin shells over the service's planning operations
(broker/service/planning.py, over broker.simulate and broker.advise).

Bad input exits with code 2 and one readable line naming the option (SpecError, raised by the
simulators, is turned into that line by broker.cli.main).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.table import Table

from broker.cli.app import get_ctx
from broker.cli.backend import local_only
from broker.cli.render import console, emit
from broker.config import Settings
from broker.errors import SpecError
from broker.service import Lockstep

if TYPE_CHECKING:
    from broker.service.planning import Advice

T = TypeVar("T")

app = typer.Typer(help="Replay policies over traces: deadline jobs on spot, cluster bursting.", no_args_is_help=True)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SPOT_TRACE = ROOT.parent / "shared/data/spot/availability/1-node/aws-10-26-2022/us-west-2a_v100_8.json"
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@app.command("deadline")
def deadline(
    ctx: typer.Context,
    trace: Annotated[list[Path], typer.Option("--trace", help="Spot availability trace (JSON: metadata.gap_seconds, "
                                                              "data); repeat it for several zones or regions, "
                                                              "aligned in time, the first the job's home.")],
    job_hours: Annotated[float, typer.Option("--job-hours", help="Compute the job needs, hours.")],
    deadline_hours: Annotated[float, typer.Option("--deadline-hours", help="Deadline after submission, hours.")],
    changeover_hours: Annotated[float, typer.Option("--changeover-hours", help="Delay of every (re)start, hours.")],
    spot_price: Annotated[float, typer.Option("--spot-price", help="Spot USD per hour.")],
    ondemand_price: Annotated[float, typer.Option("--ondemand-price", help="On-demand USD per hour.")],
    policy: Annotated[str, typer.Option("--policy", help="ondemand | greedy | uniform-progress | lockstep | optimal")],
    start_hour: Annotated[float, typer.Option("--start-hour", help="Submission, hours into the trace.")] = 0.0,
    data_gb: Annotated[float, typer.Option("--data-gb", help="Several traces: data and checkpoint moved with the "
                                                             "job to another zone, GB.")] = 0.0,
    egress_usd_per_gb: Annotated[float, typer.Option("--egress-usd-per-gb", help="Several traces: egress price "
                                                                                 "of a move, USD per GB.")] = 0.02,
    transfer_gbps: Annotated[float, typer.Option("--transfer-gbps", help="Several traces: transfer speed of a "
                                                                         "move, Gbit/s.")] = 2.0,
    json_out: JsonOpt = False,
) -> None:
    """One deadline job on spot and on-demand over a trace (the setting of "Can't Be Late", NSDI'24), or over
    several zones' traces at once (``--trace`` repeated), moving between them at a migration cost."""
    result = _with_service(get_ctx(ctx).settings, lambda svc: svc.simulate_deadline(
        trace, job_hours=job_hours, deadline_hours=deadline_hours, changeover_hours=changeover_hours,
        spot_price=spot_price, ondemand_price=ondemand_price, policy=policy, start_hour=start_hour,
        data_gb=data_gb, egress_usd_per_gb=egress_usd_per_gb, transfer_gbps=transfer_gbps))
    emit(result, json_out, _deadline_table)


def _with_service(settings: Settings, fn: Callable[[Lockstep], Awaitable[T]]) -> T:
    """``fn`` over a service without providers (planning reads traces, the catalog and the store only)."""
    async def go() -> T:
        svc = Lockstep(settings, providers={})
        try:
            return await fn(svc)
        finally:
            await svc.aclose()

    return asyncio.run(go())


def _deadline_table(d: dict[str, Any]) -> None:
    met = "[green]met[/]" if d["met_deadline"] else "[red]MISSED[/]"
    finish = "never" if d["finish_hour"] is None else f"{d['finish_hour']:.2f} h"
    moves = f"; {d['moves']} move(s) between zones" if "moves" in d else ""
    console.print(f"[bold]{d['policy']}[/]: ${d['cost']:,.2f} — spot {d['spot_hours']:.2f} h, on-demand "
                  f"{d['ondemand_hours']:.2f} h; finished at {finish}, deadline {met}{moves}")


@app.command("cluster")
def cluster(
    ctx: typer.Context,
    pods: Annotated[Path, typer.Option("--pods", help="Pod trace (Alibaba openb_pod_list CSV).")],
    onprem_gpus: Annotated[int, typer.Option("--onprem-gpus", help="GPUs in the on-prem pool.")],
    policy: Annotated[str, typer.Option("--policy", help="onprem-only | cloud-only | cheapest-first | lockstep")],
    spot_trace: Annotated[Path | None, typer.Option("--spot-trace", help="Spot availability trace for the cloud's "
                                                                         "spot market.")] = None,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU model the trace's jobs run as.")] = "H100",
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs per on-prem node.")] = 8,
    json_out: JsonOpt = False,
) -> None:
    """A GPU job trace against an on-prem pool that bursts to the cloud (costs, waits, deadline misses)."""
    settings = get_ctx(ctx).settings
    trace_path = spot_trace or DEFAULT_SPOT_TRACE
    if spot_trace is None and not trace_path.is_file():
        raise SpecError("--spot-trace", f"give a spot availability trace (the default {trace_path} is absent)")
    result = _with_service(settings, lambda svc: svc.simulate_cluster(
        pods, trace_path, onprem_gpus=onprem_gpus, gpus_per_node=gpus_per_node, gpu=gpu, policy=policy))
    emit(result, json_out, _cluster_table)


def _cluster_table(d: dict[str, Any]) -> None:
    t = Table(title=f"{d['policy']} — {d['jobs']:,} jobs, {d['onprem_gpus']} on-prem GPUs, {d['hours']:,.0f} h")
    for col in ("market", "cost", "GPU-hours"):
        t.add_column(col, justify="left" if col == "market" else "right")
    for m, c in d["cost_by_market"].items():
        t.add_row(m, f"${c:,.0f}", f"{d['gpu_hours_by_market'][m]:,.0f}")
    t.add_row("[bold]total[/]", f"[bold]${d['cost']:,.0f}[/]", f"{sum(d['gpu_hours_by_market'].values()):,.0f}")
    console.print(t)
    console.print(f"wait: mean {d['mean_wait_hours']:.2f} h, p95 {d['p95_wait_hours']:.2f} h · deadline misses "
                  f"{d['deadline_misses']:,} · jobs that burst {d['burst_share']:.1%} · preemptions "
                  f"{d['preemptions']:,} · on-prem utilisation {d['onprem_utilisation']:.1%}")


def advise_command(
    ctx: typer.Context,
    from_history: Annotated[bool, typer.Option("--from-history", help="Use the job history in the store.")] = False,
    pods: Annotated[Path | None, typer.Option("--pods", help="Use a pod trace (Alibaba CSV) instead.")] = None,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU model to price.")] = "H100",
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node bought or rented.")] = 8,
    since_days: Annotated[float, typer.Option("--since-days", help="History window (with --from-history).")] = 365.0,
    gpu_hours_per_week: Annotated[float | None, typer.Option(
        "--gpu-hours-per-week", help="A stated load instead: about N GPU-hours a week (with --peak-gpus).")] = None,
    peak_gpus: Annotated[int | None, typer.Option(
        "--peak-gpus", help="The stated load's peak, in GPUs (with --gpu-hours-per-week).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Rent, hybrid or own: yearly costs of each from the GPU-hours you used, today's prices and owned costs."""
    stated = gpu_hours_per_week is not None or peak_gpus is not None
    if stated and (gpu_hours_per_week is None or peak_gpus is None):
        missing = "--peak-gpus" if peak_gpus is None else "--gpu-hours-per-week"
        raise SpecError(missing, "a stated load needs both --gpu-hours-per-week and --peak-gpus")
    if sum((from_history, pods is not None, stated)) != 1:
        raise SpecError("--from-history", "give exactly one of --from-history, --pods and "
                        "--gpu-hours-per-week with --peak-gpus")
    if gpus_per_node < 1:
        raise SpecError("--gpus-per-node", f"must be at least 1, not {gpus_per_node}")
    if from_history:
        local_only(get_ctx(ctx), "advise --from-history")
    weekly = (gpu_hours_per_week, peak_gpus) if gpu_hours_per_week is not None and peak_gpus is not None else None
    result = _with_service(get_ctx(ctx).settings, lambda svc: svc.advise(
        pods=pods, since_days=since_days, gpu=gpu, gpus_per_node=gpus_per_node, weekly=weekly))
    emit(result.as_dict(), json_out, lambda _: _advice_table(result))


def _advice_table(a: Advice) -> None:
    u = a.usage
    console.print(f"[bold]{u['gpu_hours_per_week']:,.0f} GPU-hours a week[/] ({u['source']}: "
                  f"{u['gpu_hours']:,.0f} GPU-hours over {u['span_hours']:,.0f} h; mean {u['mean_gpus']:.1f} GPUs, "
                  f"peak {u['peak_gpus']:.1f})")
    t = Table()
    for col in ("plan", "USD per year", "owned GPUs", "owned utilisation", "rented GPU-hours/year"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for p in a.plans:
        util = "" if p["owned_utilisation"] is None else f"{p['owned_utilisation']:.0%}"
        t.add_row(p["name"], f"${p['usd_per_year']:,.0f}", str(p["owned_gpus"]), util,
                  f"{p['rented_gpu_hours_per_year']:,.0f}")
    console.print(t)
    pr = a.prices
    console.print(f"prices per GPU-hour: on-demand ${pr['on_demand']:.2f} ({pr['on_demand_offer']})"
                  + (f", spot ${pr['spot']:.2f} ({pr['spot_offer']})" if pr["spot"] else "")
                  + (f", reserved ${pr['reserved']:.2f} ({pr['reserved_basis']})" if pr["reserved"] else ""))
    if a.break_even_utilisation is not None:
        years = f"{a.break_even_years:.1f} years" if a.break_even_years else "never"
        console.print(f"owning pays above {a.break_even_utilisation:.0%} utilisation; pays back in {years} at "
                      f"{a.break_even_at_utilisation:.0%}")
    console.print(f"[bold]recommendation: {a.recommendation}[/] — {a.reason}")
    for r in a.rules:
        mark = "agrees" if r["agrees"] else f"disagrees: {r['why']}"
        console.print(f"  rule '{r['rule']}': says {r['rule_says']}, numbers say {r['numbers_say']} — {mark}")
