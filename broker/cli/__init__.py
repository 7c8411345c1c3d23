"""`lockstep` — the command line. Thin: parse, call the service, render.

The index of the package: :func:`main` (the ``lockstep`` entry point), and ``COMMANDS``/``app`` from
:mod:`broker.cli.root`, loaded when first asked for. This module imports nothing heavy, so the one
command that is run in loops, ``lockstep quote FILE --json`` with a server or the background broker up,
is answered by :mod:`broker.cli.quick` before typer (and pydantic, which it loads) is imported at all.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def main(argv: list[str] | None = None, root: Any = None) -> None:
    """Run ``lockstep`` on ``argv`` (default: the process's own arguments)."""
    if argv is None and root is None and "quote" in sys.argv[1:]:
        from broker.cli.quick import quote_json

        if quote_json(sys.argv[1:]):
            sys.exit(0)
    from broker.cli.root import app
    from broker.cli.root import main as run

    run(argv, app if root is None else root)


def __getattr__(name: str) -> Any:
    if name == "COMMANDS":
        from broker.cli.root import COMMANDS

        return COMMANDS
    raise AttributeError(name)


class _Index(types.ModuleType):
    """``broker.cli.app`` is the root typer app (``from broker.cli import app``), as it was when this module
    imported it eagerly — not the submodule of that name, which the import system binds here whenever it is
    imported (that binding is ignored; ``from broker.cli.app import …`` reads ``sys.modules`` and is unaffected)."""

    @property
    def app(self) -> Any:
        from broker.cli.root import app

        return app

    @app.setter
    def app(self, _submodule: Any) -> None:
        pass


sys.modules[__name__].__class__ = _Index


__all__ = ["COMMANDS", "app", "main"]
