"""The root typer app and the options every command shares."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated

import typer

from broker import logconfig
from broker.config import Settings, load_settings
from broker.logconfig import LogFormat

app = typer.Typer(
    name="lockstep",
    help="Lockstep: submit a GPU job once, run it where it is cheapest for that job.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@dataclass
class Context:
    config_file: str | None = None
    db: str | None = None
    server: str | None = None
    token: str | None = None
    _settings: Settings | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            over = {"db_url": self.db} if self.db else {}
            self._settings = load_settings(self.config_file, **over)
        return self._settings


def db_url_from(value: str) -> str:
    """--db accepts a URL or a plain file path (SQLite)."""
    return value if "://" in value else f"sqlite:///{os.path.abspath(value)}"


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[str | None, typer.Option("--config", envvar="LOCKSTEP_CONFIG",
                                               help="YAML configuration file.")] = None,
    db: Annotated[str | None, typer.Option("--db", help="Store URL or SQLite file (default: LOCKSTEP_DB or "
                                                        "the user data dir).")] = None,
    server: Annotated[str | None, typer.Option("--server", envvar="LOCKSTEP_SERVER",
                                               help="Use a Lockstep server instead of the local store.")] = None,
    token: Annotated[str | None, typer.Option("--token", envvar="LOCKSTEP_TOKEN", show_default=False,
                                              help="Bearer token for --server.")] = None,
    log_format: Annotated[LogFormat, typer.Option("--log-format", envvar="LOCKSTEP_LOG_FORMAT",
                                                  help="Log lines as text or JSON lines.")] = "text",
) -> None:
    logconfig.configure(log_format)
    ctx.obj = Context(config_file=config, db=db_url_from(db) if db else None, server=server, token=token)
    if ctx.invoked_subcommand != "config":  # a mistake in the configuration stops every command, at once
        _ = ctx.obj.settings


def get_ctx(ctx: typer.Context) -> Context:
    obj = ctx.find_root().obj
    assert isinstance(obj, Context)
    return obj
