"""`lockstep` — the command line. Thin: parse, call the service, render.

Exit codes: 0 success, 1 a provider or server failed, 2 bad input (one
readable line on stderr, never a traceback), 3 no feasible option.
"""

from __future__ import annotations

import logging
import os
import sys

import typer

from broker.cli import jobs as _jobs  # noqa: F401  (registers commands)
from broker.cli import quote as _quote  # noqa: F401
from broker.cli.app import app
from broker.errors import (
    BudgetExceeded,
    ConflictError,
    LockstepError,
    NoFeasibleOption,
    NotFoundError,
    ProviderError,
    SpecError,
)

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 1, 2, 3


def _click_exceptions() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
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


def _mount_optional() -> None:
    """Sub-apps owned by other modules; each mounts only if its module is present."""
    try:
        from broker.cli.bench import app as bench_app
        from broker.cli.bench import probe_command

        app.add_typer(bench_app, name="bench", help="Benchmark results: parse nccl-tests output.")
        app.command("probe", help="Measure this node (GPU, memory, NCCL, disk) and print one JSON document.")(
            probe_command
        )
    except ImportError:
        pass
    try:
        from broker.cli.prices import app as prices_app

        app.add_typer(prices_app, name="prices", help="Spot price tracking: history, alerts, replay.")
    except ImportError:
        pass
    try:
        from broker.cli.admin import register

        register(app)
    except ImportError:
        pass
    try:
        from broker.cli.burnin import register as register_burnin

        register_burnin(app)
    except ImportError:
        pass
    try:
        from broker.cli.simulate import register as register_simulate

        register_simulate(app)
    except ImportError:
        pass


_mount_optional()


def _err(line: str) -> None:
    typer.echo(f"lockstep: {line}", err=True)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="lockstep")
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
    except SpecError as e:
        _err(str(e))
        sys.exit(EXIT_BAD_INPUT)
    except NoFeasibleOption as e:
        _err(str(e))
        sys.exit(EXIT_INFEASIBLE)
    except (NotFoundError, ConflictError, BudgetExceeded) as e:
        _err(str(e))
        sys.exit(EXIT_BAD_INPUT if isinstance(e, NotFoundError | ConflictError) else EXIT_FAIL)
    except (ProviderError, LockstepError) as e:
        _err(str(e))
        sys.exit(EXIT_FAIL)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # never a traceback for users; LOCKSTEP_DEBUG=1 shows it
        if os.environ.get("LOCKSTEP_DEBUG"):
            raise
        _err(f"internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
             "(set LOCKSTEP_DEBUG=1 for the traceback)")
        sys.exit(EXIT_FAIL)
    sys.exit(rv if isinstance(rv, int) else EXIT_OK)
