"""`lockstep submit | jobs | status | cancel | logs`: through the SDK's client, to a server (``--server``) or to
this store's background broker (started by the first of these commands that needs it)."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from broker.cli import render
from broker.cli.app import get_ctx
from broker.cli.backend import with_client
from broker.models import TERMINAL_STATES, Job, JobState, LogLine
from broker.specs import load_spec

if TYPE_CHECKING:
    from broker.sdk import AsyncClient

PLACE_WAIT_S = 15.0  # how long `submit` waits to show where the broker placed a job (it carries on regardless)
PLACE_POLL_S = 0.2


def submit(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="Job spec file (YAML or JSON).")],
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Retrying with the same key returns the same job.")
    ] = None,
    place: Annotated[bool, typer.Option("--place/--no-place",
                                        help="Without a server: wait a little for the background broker's "
                                             "first placement, to show where the job goes.")] = True,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Submit a job. Once accepted it is stored and survives a broker crash."""
    spec = load_spec(job)
    c = get_ctx(ctx)

    warning = ""

    async def run(client: AsyncClient) -> Job:
        nonlocal warning
        j = await client.submit(spec.model_dump(mode="json"), idempotency_key=idempotency_key)
        warning = str(j.decision.get("warning") or "")  # a placement below may replace the decision
        if place and not c.server:
            j = await _first_decision(client, j)
        return j

    j = with_client(c, run)
    if warning:
        typer.echo(warning, err=True)  # on stderr, so `--json` output and the printed id stay parseable
    if json_out:
        render.print_json(j)
    else:
        where = f" on {j.placement.provider} {j.placement.sku} ({j.placement.zone or j.placement.region})" \
            if j.placement else ""
        # A job accepted with a warning carries it as its reason too: said once, above.
        reason = j.reason if j.reason and j.reason != warning else ""
        render.console.print(f"job {j.id} {j.state.value}{where}" + (f": {reason}" if reason else ""))
        print(j.id)


async def _first_decision(client: AsyncClient, job: Job) -> Job:
    """The job once the broker has placed it or said why it waits (a new event), or as it is after a short
    while: the broker follows it either way."""
    deadline = time.monotonic() + PLACE_WAIT_S
    seen = len(job.events)
    while time.monotonic() < deadline:
        await asyncio.sleep(PLACE_POLL_S)
        job = Job.model_validate(dict(await client.job(job.id)))  # the submission's shape, as through a server
        if job.state is not JobState.pending or len(job.events) > seen:
            break
    return job


def list_jobs(
    ctx: typer.Context,
    state: Annotated[
        list[JobState] | None, typer.Option("--state", help="Only jobs in this state (repeatable).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Jobs, newest first."""
    jobs = with_client(get_ctx(ctx), lambda client: client.jobs(states=state, limit=limit))
    render.emit(jobs, json_out, render.jobs_table)


def status(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """One job with its events, spend and allocations (with --json)."""
    j = with_client(get_ctx(ctx), lambda client: client.job(job_id))
    render.emit(j, json_out, render.job_detail)


def cancel(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Cancel a job and release everything it holds."""
    j = with_client(get_ctx(ctx), lambda client: client.cancel(job_id))
    if json_out:
        render.print_json(j)
    else:
        render.console.print(f"job {j.id} {j.state.value}")


def logs(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")] = False,
    tail: Annotated[int | None, typer.Option("--tail", min=0, max=100_000,
                                             help="Only the last N lines (with --follow, then every new one).")] = None,
    timestamps: Annotated[bool, typer.Option("--timestamps", "-t", help="Prefix each line with its UTC time.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document per line.")] = False,
) -> None:
    """What a job printed (its current or last attempt, every node), secret values masked."""
    c = get_ctx(ctx)

    def show(ln: LogLine, nodes: set[int]) -> None:
        if json_out:
            typer.echo(ln.model_dump_json())
            return
        head = f"{ln.at:%Y-%m-%dT%H:%M:%S.%f}"[:-3] + "Z " if timestamps and ln.at else ""
        node = f"[{ln.rank}] " if nodes - {0} else ""
        note = "lockstep: " if ln.stream == "lockstep" else ""
        typer.echo(f"{head}{node}{note}{ln.text}", err=ln.stream == "err")

    async def run(client: AsyncClient) -> None:
        if not follow:
            lines = [ln async for ln in client.logs(job_id, tail=tail)]
            ranks = {ln.rank for ln in lines}
            for ln in lines:
                show(ln, ranks)
            if not lines and tail != 0:
                typer.echo(no_output(await client.job(job_id)), err=True)
            return
        ranks = set()
        shown = 0
        async for ln in client.logs(job_id, tail=tail, follow=True):
            ranks.add(ln.rank)
            show(ln, ranks)
            shown += 1
            sys.stdout.flush()
        job = await client.job(job_id)
        if job.state not in TERMINAL_STATES:  # the server's api.log_follow_max_s ended the stream
            typer.echo(f"lockstep: the server ended the stream; job {job_id} is {job.state.value} "
                       f"(lockstep logs {job_id} -f --tail 0 carries on)", err=True)
        elif not shown and tail != 0:
            typer.echo(no_output(job), err=True)

    with_client(c, run)


def no_output(job: Job) -> str:
    """The line `lockstep logs` prints (on stderr) for a job with no log lines: why there are none."""
    if job.state in TERMINAL_STATES:
        return f"lockstep: job {job.id} ({job.state.value}) produced no output"
    if job.state is JobState.running:
        return f"lockstep: job {job.id} is running and has printed nothing yet"
    return f"lockstep: job {job.id} is {job.state.value}: no output yet"
