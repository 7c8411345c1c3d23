"""The command list and the runner: every command through typer (``broker.cli`` is the index).

Exit codes (each error class carries its own, broker/errors.py): 0 success, 1 a provider
or server failed, 2 bad input (one readable line on stderr, never a traceback), 3 no
feasible option.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import typer

from broker.cli.app import Command, app, commands
from broker.errors import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_OK, LockstepError

# Every command, in the order `lockstep --help` lists them. A command's module is imported when it runs.
COMMANDS = (
    Command("submit", "broker.cli.jobs:submit",
            "Submit a job. Once accepted it is stored and survives a broker crash."),
    Command("jobs", "broker.cli.jobs:list_jobs", "Jobs, newest first."),
    Command("status", "broker.cli.jobs:status",
            "One job with its events, spend and allocations (with --json)."),
    Command("cancel", "broker.cli.jobs:cancel", "Cancel a job and release everything it holds."),
    Command("logs", "broker.cli.jobs:logs",
            "What a job printed (its current or last attempt, every node), secret values masked."),
    Command("quote", "broker.cli.quote:quote", "What the job would cost, where, and why: ranked by expected job cost."),
    Command("offers", "broker.cli.offers:offers", "The offer book, cheapest per GPU-hour first."),
    Command("gpus", "broker.cli.gpus:gpus",
            "GPU models in the current offer book: markets, regions, units and $/GPU-hour per market."),
    Command("probe", "broker.cli.bench:probe_command",
            "Measure this node (GPU, memory, NCCL, disk) and print one JSON document."),
    Command("serve", "broker.cli.admin:serve",
            "Run the HTTP API and the broker's background loops until stopped (Ctrl-C / SIGTERM)."),
    Command("burnin", "broker.cli.burnin:burnin_command",
            "Burn a node in: run the probe there as a batch job, store the result, drain the node if unhealthy."),
    Command("bench", "broker.cli.burnin:bench_group", "Benchmark results: parse nccl-tests output, record, list.",
            group=True),
    Command("prices", "broker.cli.prices:app", "Spot price tracking: history, alerts, replay."),
    Command("server", "broker.cli.server:app",
            "The background broker that follows local jobs (started by the first command that needs it)."),
    Command("tokens", "broker.cli.admin:tokens_app", "API tokens (bearer), each bound to a tenant and a role."),
    Command("tenants", "broker.cli.admin:tenants_app", "Tenants and their caps (monthly budget, GPUs)."),
    Command("config", "broker.cli.config:config_app",
            "The configuration: check a file for mistakes, show what is in effect."),
    Command("simulate", "broker.cli.simulate:app",
            "Replay policies over traces: deadline jobs on spot, cluster bursting."),
    Command("advise", "broker.cli.simulate:advise_command",
            "Rent, hybrid or own: yearly costs of each from the GPU-hours you used, today's prices and owned costs."),
)
commands(*COMMANDS)


# Exception classes of whichever click copies are installed, found at run time: typed by what is
# read from them (exit_code, format_message), not by one module's classes.
_Classes = tuple[Any, ...]


def _click_exceptions() -> tuple[_Classes, _Classes, _Classes, _Classes]:
    """(Exit, UsageError, ClickException, Abort) classes: newer typer vendors its own click."""
    mods = []
    try:
        import typer._click.exceptions as vendored

        mods.append(vendored)
    except ImportError:
        pass
    try:
        import click.exceptions as real

        mods.append(real)
    except ImportError:
        pass
    pick = lambda name: tuple(getattr(m, name) for m in mods if hasattr(m, name))  # noqa: E731
    return pick("Exit"), pick("UsageError"), pick("ClickException"), pick("Abort")


_EXIT, _USAGE, _CLICK, _ABORT = _click_exceptions()


def _err(line: str) -> None:
    typer.echo(f"lockstep: {line}", err=True)


def main(argv: list[str] | None = None, root: typer.Typer = app) -> None:
    """Run ``root`` (the `lockstep` app) on ``argv``; every failure is one line on stderr and its exit code."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        rv = root(args=argv, standalone_mode=False, prog_name="lockstep")
    except _EXIT as e:
        sys.exit(e.exit_code)
    except _USAGE as e:
        msg = e.format_message().strip().splitlines()
        _err(msg[0] if msg else "usage error")
        sys.exit(EXIT_BAD_INPUT)
    except _CLICK as e:
        _err(e.format_message())
        sys.exit(EXIT_FAIL)
    except _ABORT:
        sys.exit(130)
    except LockstepError as e:
        _err(str(e))
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # never a traceback for users; LOCKSTEP_DEBUG=1 shows it
        if os.environ.get("LOCKSTEP_DEBUG"):
            raise
        _err(f"internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
             "(set LOCKSTEP_DEBUG=1 for the traceback)")
        sys.exit(EXIT_FAIL)
    sys.exit(rv if isinstance(rv, int) else EXIT_OK)


__all__ = ["COMMANDS", "app", "main"]
