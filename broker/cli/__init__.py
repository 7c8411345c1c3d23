"""`lockstep` — the command line. Thin: parse, call the service, render.

The index of the package: :func:`main` (the ``lockstep`` entry point), and ``COMMANDS``/``app`` from
:mod:`broker.cli.root`, loaded when first asked for. This module imports nothing heavy, so the one
command that is run in loops, ``lockstep quote FILE --json`` with a server or the background broker up,
is answered by :mod:`broker.cli.quick` before typer (and pydantic, which it loads) is imported at all.
"""

from __future__ import annotations

import sys
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
    if name in ("COMMANDS", "app"):
        from broker.cli import root

        return getattr(root, name)
    raise AttributeError(name)


__all__ = ["COMMANDS", "app", "main"]
