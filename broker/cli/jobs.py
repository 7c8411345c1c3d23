"""`lockstep submit | jobs | status | cancel`."""

from __future__ import annotations

from typing import Annotated

import typer

from broker.cli import render
from broker.cli.app import get_ctx
from broker.cli.backend import Backend, with_backend
from broker.models import Job, JobState
from broker.specs import load_spec


def submit(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="Job spec file (YAML or JSON).")],
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Retrying with the same key returns the same job.")
    ] = None,
    place: Annotated[bool, typer.Option("--place/--no-place",
                                        help="Without a server: try to place the job right away.")] = True,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Submit a job. Once accepted it is stored and survives a broker crash."""
    spec = load_spec(job)
    c = get_ctx(ctx)

    warning = ""

    async def run(backend: Backend) -> Job:
        nonlocal warning
        j = await backend.submit(spec.model_dump(mode="json"), idempotency_key)
        warning = str(j.decision.get("warning") or "")  # a placement below may replace the decision
        if place and not c.server:
            await backend.place([j.id])
            j = await backend.status(j.id)
        return j

    j = with_backend(c, run, need_store=True)
    if warning:
        typer.echo(warning, err=True)  # on stderr, so `--json` output and the printed id stay parseable
    if json_out:
        render.print_json(j)
    else:
        where = f" on {j.placement.provider} {j.placement.sku} ({j.placement.zone or j.placement.region})" \
            if j.placement else ""
        render.console.print(f"job {j.id} {j.state.value}{where}" + (f": {j.reason}" if j.reason else ""))
        print(j.id)


def list_jobs(
    ctx: typer.Context,
    state: Annotated[
        list[JobState] | None, typer.Option("--state", help="Only jobs in this state (repeatable).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Jobs, newest first."""
    jobs = with_backend(get_ctx(ctx), lambda b: b.jobs(state, limit), need_store=True)
    render.emit(jobs, json_out, render.jobs_table)


def status(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """One job with its events (without a server, polls its provider first)."""
    c = get_ctx(ctx)

    async def run(backend: Backend) -> Job:
        if not c.server:
            await backend.status(job_id)  # NotFound before touching providers
            await backend.poll()
        return await backend.status(job_id)

    j = with_backend(c, run, need_store=True)
    render.emit(j, json_out, render.job_detail)


def cancel(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Cancel a job and release everything it holds."""
    j = with_backend(get_ctx(ctx), lambda b: b.cancel(job_id), need_store=True)
    if json_out:
        render.print_json(j)
    else:
        render.console.print(f"job {j.id} {j.state.value}")
