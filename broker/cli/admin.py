"""`lockstep tokens|tenants ...` (on the local store, or through a server with an admin token: --server) and
`lockstep serve`.

`tokens create` prints the new token alone on its last line, so scripts can
capture it: ``TOKEN=$(lockstep tokens create --tenant acme | tail -n1)``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Annotated

import typer
from rich.table import Table

from broker.cli import render
from broker.cli.app import get_ctx
from broker.cli.backend import local_only, validated, with_store_or_server
from broker.errors import SpecError
from broker.models import Role, Tenant, TenantCreate, TenantPatch, TokenCreate

tokens_app = typer.Typer(help="API tokens (bearer), each bound to a tenant and a role.", no_args_is_help=True,
                         add_completion=False, pretty_exceptions_enable=False)
tenants_app = typer.Typer(help="Tenants and their caps (monthly budget, GPUs).", no_args_is_help=True,
                          add_completion=False, pretty_exceptions_enable=False)


# --------------------------------------------------------------------------- tokens


@tokens_app.command("create")
def tokens_create(
    ctx: typer.Context,
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant the token acts for (created if new).")],
    role: Annotated[Role, typer.Option(
        "--role", help="user: its tenant's jobs; admin: everything; metrics: GET /metrics only (a scraper).",
    )] = Role.user,
    label: Annotated[str, typer.Option("--label", help="A note to tell tokens apart.")] = "",
    json_out: Annotated[bool, typer.Option("--json", help="Print the token's record and the token as JSON.")] = False,
) -> None:
    """Create a token. The token is shown once, alone on the last line; only its hash is stored."""
    body = validated(TokenCreate, tenant=tenant, role=role, label=label)  # the rules of POST /v1/tokens
    info, plaintext = with_store_or_server(get_ctx(ctx), lambda svc: svc.create_token(body),
                                           lambda remote: remote.create_token(body))
    if json_out:
        render.print_json(info.model_dump(mode="json") | {"token": plaintext})
        return
    typer.echo(f"created token {info.id} for tenant {info.tenant} (role {info.role.value})")
    typer.echo(plaintext)


@tokens_app.command("list")
def tokens_list(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's tokens.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List tokens (ids, tenants, roles; never the secrets)."""
    tokens = with_store_or_server(get_ctx(ctx), lambda svc: svc.list_tokens(tenant),
                                  lambda remote: remote.tokens(tenant))
    if json_out:
        render.print_json(tokens)
        return
    t = Table()
    for col in ("id", "tenant", "role", "label", "created", "revoked"):
        t.add_column(col)
    for tok in tokens:
        t.add_row(tok.id, tok.tenant, tok.role.value, tok.label, tok.created_at.strftime("%Y-%m-%d %H:%M"),
                  "yes" if tok.revoked else "")
    render.console.print(t)


@tokens_app.command("revoke")
def tokens_revoke(
    ctx: typer.Context,
    token_id: Annotated[str, typer.Argument(help="Token id (tok_...).")],
    json_out: Annotated[bool, typer.Option("--json", help='Print {"revoked": ID} as JSON.')] = False,
) -> None:
    """Revoke a token: the server refuses it from then on (within its short verification cache)."""
    with_store_or_server(get_ctx(ctx), lambda svc: svc.revoke_token(token_id),
                         lambda remote: remote.revoke_token(token_id))
    if json_out:
        render.print_json({"revoked": token_id})
    else:
        typer.echo(f"revoked {token_id}")


# --------------------------------------------------------------------------- tenants


def _tenants_table(tenants: list[Tenant]) -> None:
    t = Table()
    for col in ("name", "monthly budget $", "spent this month $", "max GPUs", "created"):
        t.add_column(col)
    for x in tenants:
        t.add_row(x.name, "" if x.monthly_budget_usd is None else f"{x.monthly_budget_usd:,.2f}",
                  f"{x.month_to_date_usd:,.4f}", "" if x.max_gpus is None else str(x.max_gpus),
                  x.created_at.strftime("%Y-%m-%d %H:%M"))
    render.console.print(t)


@tenants_app.command("create")
def tenants_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Tenant name (letters, digits, . _ -).")],
    monthly_usd: Annotated[float | None, typer.Option("--monthly-usd", min=0, help="Monthly budget, USD.")] = None,
    max_gpus: Annotated[int | None, typer.Option("--max-gpus", min=0, help="GPUs held at once.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the tenant as JSON.")] = False,
    budget: Annotated[float | None, typer.Option("--budget", min=0, hidden=True,
                                                 help="Deprecated: use --monthly-usd.")] = None,
) -> None:
    """Create a tenant."""
    if budget is not None and monthly_usd is not None and budget != monthly_usd:
        raise SpecError("monthly_usd", "give --monthly-usd once (--budget is its deprecated alias)")
    monthly = monthly_usd if monthly_usd is not None else budget
    body = validated(TenantCreate, name=name, monthly_budget_usd=monthly, max_gpus=max_gpus)
    tenant = with_store_or_server(get_ctx(ctx), lambda svc: svc.create_tenant(body),
                                  lambda remote: remote.create_tenant(body))
    render.emit(tenant, json_out, lambda t: _tenants_table([t]))


@tenants_app.command("list")
def tenants_list(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List tenants and their caps."""
    tenants = with_store_or_server(get_ctx(ctx), lambda svc: svc.list_tenants(),
                                   lambda remote: remote.tenants())
    if json_out:
        render.print_json(tenants)
    else:
        _tenants_table(tenants)


@tenants_app.command("set-budget")
def tenants_set_budget(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    monthly_usd: Annotated[float | None, typer.Option("--monthly-usd", min=0, help="USD a month.")] = None,
    max_gpus: Annotated[int | None, typer.Option("--max-gpus", min=0, help="GPUs held at once.")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove both caps.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the tenant as JSON.")] = False,
) -> None:
    """Set a tenant's monthly budget and/or GPU cap (the router enforces them at placement)."""
    fields: dict[str, float | int | None] = {}
    if clear:
        fields = {"monthly_budget_usd": None, "max_gpus": None}
    if monthly_usd is not None:
        fields["monthly_budget_usd"] = monthly_usd
    if max_gpus is not None:
        fields["max_gpus"] = max_gpus
    if not fields:
        raise SpecError("", "give --monthly-usd, --max-gpus or --clear")
    patch = validated(TenantPatch, **fields)
    tenant = with_store_or_server(get_ctx(ctx), lambda svc: svc.update_tenant(name, patch),
                                  lambda remote: remote.update_tenant(name, patch))
    render.emit(tenant, json_out, lambda t: _tenants_table([t]))


# --------------------------------------------------------------------------- serve


def serve(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option("--host", help="Address (default: api.host).")] = None,
    port: Annotated[int | None, typer.Option("--port", min=0, max=65535,
                                             help="Port (default: api.port; 0 picks a free one).")] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Server processes sharing the port "
                                         "(SO_REUSEPORT), each a broker replica; more than 1 needs PostgreSQL.")] = 1,
) -> None:
    """Run the HTTP API and the broker's background loops until stopped (Ctrl-C / SIGTERM)."""
    from broker.api import serve as run_api
    from broker.cli.progress import Progress
    from broker.config import sound_settings

    c = get_ctx(ctx)
    local_only(c, "serve")
    # One validation path: what `lockstep config check` refuses, serve refuses too, with the same lines.
    settings = sound_settings(c.config_file, **({"db_url": c.db} if c.db else {}))
    logging.getLogger().setLevel(settings.log_level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if workers > 1:
        from broker.api.workers import check_workers

        check_workers(settings, workers)  # before any output: a refusal is one line
    # On stderr until it listens: opening and migrating the store, reconciling jobs with the providers.
    progress = Progress("starting: opening the store, reconciling jobs with the providers")

    def ready(url: str) -> None:
        progress.done()
        # One line on stdout that scripts (and the benchmark) wait for.
        print(f"lockstep: serving on {url}", flush=True)

    if workers > 1:
        from broker.api.workers import run_workers

        try:
            status = run_workers(settings, host or settings.api.host, settings.api.port if port is None else port,
                                 workers, ready=ready)
        finally:
            progress.done()
        sys.exit(status)
    try:
        asyncio.run(run_api(settings, host or settings.api.host, settings.api.port if port is None else port,
                            ready=ready))
    except KeyboardInterrupt:
        sys.exit(0)
    finally:
        progress.done()

