"""The root typer app, the options every command shares, and how commands load.

Commands are listed once, in ``broker.cli.COMMANDS``: a name, where the command lives
(``module:attribute``, a command function or a ``typer.Typer`` group) and its one-line help.
The root group shows that list without importing anything; a command's module is imported
when the command runs (or its own ``--help`` is asked), so each command loads only what it
uses. A module that fails to import fails its command loudly; nothing vanishes from the list.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import typer
from typer.core import TyperCommand, TyperGroup

from broker import logconfig
from broker.logconfig import LogFormat

if TYPE_CHECKING:
    from broker.cli.localbroker import BrokerInfo
    from broker.config import Settings

# Commands that go through the background broker: when one is up for exactly this configuration, they need
# not load the settings at all (it was started with them, so they were checked then).
BROKER_COMMANDS = frozenset({"submit", "jobs", "status", "cancel", "logs", "quote", "offers", "gpus"})


@dataclass(frozen=True)
class Command:
    """One entry of the command list."""

    name: str
    target: str  # "module:attribute": a command function, a typer.Typer, or (group=True) a function returning one
    help: str  # the line `lockstep --help` shows: the first line of the command's own help
    group: bool = False


@cache
def load(entry: Command) -> Any:
    """The click command of ``entry``: its module imported, its typer function or group converted (once)."""
    module, _, attribute = entry.target.partition(":")
    obj = getattr(importlib.import_module(module), attribute)
    if entry.group and not isinstance(obj, typer.Typer):
        obj = obj()
    holder = typer.Typer()  # registered as `app.add_typer(…)` / `app.command(…)` would on the root app
    if isinstance(obj, typer.Typer):
        holder.add_typer(obj, name=entry.name)
    else:
        holder.command(entry.name)(obj)
    return typer.main.get_group(holder).commands[entry.name]


class _Deferred(TyperCommand):
    """A listed command whose module is not imported yet: it has its name and help, and becomes the
    real command as soon as it is asked to parse arguments."""

    def __init__(self, entry: Command) -> None:
        super().__init__(name=entry.name, help=entry.help, short_help=entry.help, callback=None)
        self.entry = entry

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        return load(self.entry).make_context(info_name, args, parent=parent, **extra)


class LazyGroup(TyperGroup):
    """The root group over ``COMMANDS`` (commands registered on the app directly come first)."""

    commands_table: ClassVar[dict[str, Command]] = {}

    def list_commands(self, ctx: Any) -> list[str]:
        eager = super().list_commands(ctx)
        return [*eager, *(name for name in self.commands_table if name not in eager)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in self.commands_table:
            command = _Deferred(self.commands_table[cmd_name])
        return command


app = typer.Typer(
    name="lockstep",
    cls=LazyGroup,
    help="Lockstep: submit a GPU job once, run it where it is cheapest for that job.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
    # The root's help is click's plain text: rich (and its markdown parser) would cost `lockstep --help`
    # a third of its start-up. Each command's own --help keeps typer's rich layout.
    rich_markup_mode=None,
)


def commands(*entries: Command) -> None:
    """Make ``entries`` the root group's command list, in the order given."""
    LazyGroup.commands_table = {e.name: e for e in entries}


@dataclass
class Context:
    config_file: str | None = None
    db: str | None = None
    server: str | None = None
    token: str | None = None
    _settings: Settings | None = field(default=None, repr=False)
    _broker: BrokerInfo | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from broker.config import load_settings

            over = {"db_url": self.db} if self.db else {}
            self._settings = load_settings(self.config_file, **over)
        return self._settings

    def quick_broker(self) -> BrokerInfo | None:
        """The background broker a command already found for this very configuration, if it is up."""
        if self._broker is None and not self.server:
            from broker.cli.localbroker import quick

            self._broker = quick(self.config_file, self.db)
        return self._broker

    def local_broker(self, *, start: bool) -> BrokerInfo | None:
        """This store's background broker: the one up with these settings, or (``start``) a new one."""
        if self.quick_broker() is None:
            from broker.cli.localbroker import ensure, find

            if start:
                self._broker = ensure(self.settings, self.config_file, self.db,
                                      timeout_s=self.settings.local.start_timeout_s)
            else:
                self._broker = find(self.settings, self.config_file, self.db)
        return self._broker


def version() -> str:
    """The installed package's version (the source tree's when it runs uninstalled)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("lockstep")
    except PackageNotFoundError:  # pragma: no cover - a checkout on PYTHONPATH without an install
        return "0+unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"lockstep {version()}")
        raise typer.Exit(0)


def db_url_from(value: str) -> str:
    """--db accepts a URL or a plain file path (SQLite)."""
    from broker.cli.localbroker import db_url_from as url

    return url(value)


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[str | None, typer.Option("--config", envvar="LOCKSTEP_CONFIG",
                                               help="YAML configuration file.")] = None,
    db: Annotated[str | None, typer.Option("--db", help="Store URL or SQLite file (default: LOCKSTEP_DB or "
                                                        "the user data dir).")] = None,
    server: Annotated[str | None, typer.Option("--server", envvar="LOCKSTEP_SERVER",
                                               help="Use a Lockstep server instead of the local store "
                                                    "and its background broker.")] = None,
    token: Annotated[str | None, typer.Option("--token", envvar="LOCKSTEP_TOKEN", show_default=False,
                                              help="Bearer token for --server.")] = None,
    log_format: Annotated[LogFormat, typer.Option("--log-format", envvar="LOCKSTEP_LOG_FORMAT",
                                                  help="Log lines as text or JSON lines.")] = "text",
    _version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                           help="Print the version and exit.")] = False,
) -> None:
    logconfig.configure(log_format)
    ctx.obj = Context(config_file=config, db=db_url_from(db) if db else None, server=server, token=token)
    if ctx.invoked_subcommand in ("config", "serve"):
        return  # both check the configuration themselves and print every problem, each a line
    if ctx.invoked_subcommand in BROKER_COMMANDS and ctx.obj.quick_broker() is not None:
        return  # the broker up for this configuration was started with it: it was checked then
    _ = ctx.obj.settings  # a mistake in the configuration stops every command, at once


def get_ctx(ctx: typer.Context) -> Context:
    obj = ctx.find_root().obj
    assert isinstance(obj, Context)
    return obj


