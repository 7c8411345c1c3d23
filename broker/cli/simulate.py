"""`lockstep simulate deadline|cluster` and `lockstep advise`: thin shells over broker.simulate and broker.advise.

Bad input exits with code 2 and one readable line naming the option (SpecError, raised by the
simulators, is turned into that line by broker.cli.main).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from broker.advise import Advice, advise, catalog_prices, usage_from_history, usage_from_pods
from broker.cli.app import get_ctx
from broker.cli.backend import local_only
from broker.cli.render import console, emit
from broker.config import Settings
from broker.errors import SpecError
from broker.models import utcnow
from broker.simulate.cluster import ClusterConfig, run_cluster
from broker.simulate.deadline import DeadlineJob, run_deadline
from broker.simulate.traces import load_pods, load_spot_trace
from broker.simulate.zones import Migration, run_deadline_zones

app = typer.Typer(help="Replay policies over traces: deadline jobs on spot, cluster bursting.", no_args_is_help=True)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SPOT_TRACE = ROOT.parent / "shared/data/spot/availability/1-node/aws-10-26-2022/us-west-2a_v100_8.json"
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@app.command("deadline")
def deadline(
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
    job = DeadlineJob(job_hours, deadline_hours, changeover_hours, spot_price, ondemand_price)
    if len(trace) == 1:
        result = run_deadline(load_spot_trace(trace[0]), job, policy, start_hour)
    else:
        result = run_deadline_zones([load_spot_trace(t) for t in trace], job, policy,
                                    Migration.of(data_gb, egress_usd_per_gb, transfer_gbps), start_hour)
    emit(result.as_dict(), json_out, _deadline_table)


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
    cfg = ClusterConfig(onprem_gpus=onprem_gpus, gpus_per_node=gpus_per_node, gpu=_gpu(gpu),
                        max_queue_wait_hours=settings.broker.max_queue_wait_hours, owned=settings.slurm.owned)
    cfg.validate()
    result = run_cluster(load_pods(pods), cfg, load_spot_trace(trace_path, "--spot-trace"), policy)
    emit(result.as_dict(), json_out, _cluster_table)


def _gpu(name: str) -> str:
    from broker.gpus import accepted_models

    if not accepted_models(name):
        raise SpecError("--gpu", f"unknown GPU model {name!r}")
    return name


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
    json_out: JsonOpt = False,
) -> None:
    """Rent, hybrid or own: yearly costs of each from the GPU-hours you used, today's prices and owned costs."""
    if from_history == (pods is not None):
        raise SpecError("--from-history", "give exactly one of --from-history and --pods")
    if gpus_per_node < 1:
        raise SpecError("--gpus-per-node", f"must be at least 1, not {gpus_per_node}")
    if from_history:
        local_only(get_ctx(ctx), "advise --from-history")
    settings = get_ctx(ctx).settings
    usage = usage_from_pods(load_pods(pods)) if pods is not None else _history(settings, since_days)
    result = advise(usage, catalog_prices(_gpu(gpu), gpus_per_node), settings.slurm.owned, gpus_per_node)
    emit(result.as_dict(), json_out, lambda _: _advice_table(result))


def _history(settings: Settings, since_days: float) -> Any:
    if not since_days > 0:
        raise SpecError("--since-days", f"must be positive, not {since_days:g}")
    from broker.models import JobState
    from broker.service import Lockstep

    async def read() -> Any:
        svc = Lockstep(settings, providers={})
        try:
            now = utcnow()
            since = now - timedelta(days=since_days)
            rows = await svc.db(svc.store.job_usage, since, now)
            allocs = await svc.db(svc.store.allocations)
            interruptible: set[str] = set()
            cursor = None
            while True:
                jobs, cursor = await svc.list_jobs(limit=1000, cursor=cursor)
                interruptible |= {j.id for j in jobs if j.spec.interruptible and j.state is not JobState.cancelled}
                if not cursor:
                    break
            return usage_from_history(rows, allocs, interruptible, now)
        finally:
            await svc.aclose()

    return asyncio.run(read())


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
