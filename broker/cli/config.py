"""`lockstep config check|show`: find every mistake in a configuration; print what is in effect."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from broker.cli.app import get_ctx
from broker.config import check_config, effective

config_app = typer.Typer(help="The configuration: check a file for mistakes, show what is in effect.",
                         no_args_is_help=True)


@config_app.command("check")
def check(
    ctx: typer.Context,
    file: Annotated[str | None, typer.Argument(help="YAML file (default: --config / LOCKSTEP_CONFIG).",
                                               show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The problems as a JSON list.")] = False,
) -> None:
    """Report every problem at once, one line each (where, key, what): unknown keys, wrong types, a provider
    enabled without its credential, a database URL that cannot work, a secret written inline. Exit 2 on any.

    The file is checked as it would load here: the environment (LOCKSTEP_*) counts too.
    """
    path = file or get_ctx(ctx).config_file
    problems = check_config(path)
    if as_json:
        typer.echo(json.dumps([{"key": p.key, "message": p.message, "where": p.where} for p in problems],
                              indent=2))
    elif problems:
        for p in problems:
            typer.echo(str(p))
    else:
        typer.echo(f"{path or 'the environment'}: ok")
        _notes(path)
    if problems:
        raise typer.Exit(2)


def _notes(path: str | None) -> None:
    """What the enabled markets say about a configuration that loads (e.g. how EC2 instances report)."""
    from broker.config import load_settings
    from broker.service import config_notes  # what the markets say: the service speaks for them

    for note in config_notes(load_settings(path)):
        typer.echo(note)


@config_app.command("show")
def show(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="{key: {value, source, origin}} as JSON.")] = False,
) -> None:
    """The effective configuration: every setting, its value (secrets masked) and where it came from
    (default, file with its line, env with the variable, override)."""
    c = get_ctx(ctx)
    over = {"db_url": c.db} if c.db else {}
    entries = list(effective(c.config_file, **over))
    if as_json:
        typer.echo(json.dumps({e.key: {"value": e.value, "source": e.source, "origin": e.origin}
                               for e in entries}, indent=2))
        return
    width = max(len(e.key) for e in entries)
    for e in entries:
        where = f"{e.source} {e.origin}".strip() if e.origin and e.source != "override" else e.source
        typer.echo(f"{e.key:<{width}}  {json.dumps(e.value)}  ({where})")
