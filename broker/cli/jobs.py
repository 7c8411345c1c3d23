"""`lockstep submit | jobs | status | cancel`."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from broker.cli import render
from broker.cli.app import app, get_ctx
from broker.cli.backend import open_backend
from broker.models import JobState
from broker.specs import load_spec


def _run(coro_fn):
    return asyncio.run(coro_fn())


@app.command()
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
    backend = open_backend(c, need_store=True)

    async def run():
        try:
            j = await backend.submit(spec.model_dump(mode="json"), idempotency_key)
            if place and not c.server:
                await backend.svc.place_now([j.id])  # type: ignore[attr-defined]
                j = await backend.status(j.id)
            return j
        finally:
            await backend.aclose()

    j = _run(run)
    if json_out:
        render.print_json(j)
    else:
        where = f" on {j.placement.provider} {j.placement.sku} ({j.placement.zone or j.placement.region})" \
            if j.placement else ""
        render.console.print(f"job {j.id} {j.state.value}{where}" + (f": {j.reason}" if j.reason else ""))
        print(j.id)


@app.command("jobs")
def list_jobs(
    ctx: typer.Context,
    state: Annotated[
        list[JobState] | None, typer.Option("--state", help="Only jobs in this state (repeatable).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Jobs, newest first."""
    backend = open_backend(get_ctx(ctx), need_store=True)

    async def run():
        try:
            return await backend.jobs(state, limit)
        finally:
            await backend.aclose()

    jobs = _run(run)
    if json_out:
        render.print_json(jobs)
    else:
        render.jobs_table(jobs)


@app.command()
def status(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """One job with its events (without a server, polls its provider first)."""
    c = get_ctx(ctx)
    backend = open_backend(c, need_store=True)

    async def run():
        try:
            if not c.server:
                await backend.status(job_id)  # NotFound before touching providers
                await backend.svc.poll_now()  # type: ignore[attr-defined]
            return await backend.status(job_id)
        finally:
            await backend.aclose()

    j = _run(run)
    if json_out:
        render.print_json(j)
    else:
        render.job_detail(j)


@app.command()
def cancel(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Cancel a job and release everything it holds."""
    backend = open_backend(get_ctx(ctx), need_store=True)

    async def run():
        try:
            return await backend.cancel(job_id)
        finally:
            await backend.aclose()

    j = _run(run)
    if json_out:
        render.print_json(j)
    else:
        render.console.print(f"job {j.id} {j.state.value}")
