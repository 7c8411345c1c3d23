"""`lockstep quote`.

``quote FILE --json`` with a server or this store's background broker up is answered by broker/cli/quick.py,
usually before this module is even imported (the process never loads the domain models, the offer book or
numpy; bench/startup.py measures it). Everything else takes the general path here: the spec read and checked,
the answer rendered from the models.
"""

from __future__ import annotations

from typing import Annotated

import typer

from broker.cli.app import Context, get_ctx


def quote(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="Job spec file (YAML or JSON).")],
    top: Annotated[int, typer.Option(min=1, max=1000, help="How many options to show.")] = 10,
    explain: Annotated[bool, typer.Option("--explain", help="Also say why every other offer was rejected.")] = False,
    provider: Annotated[list[str] | None, typer.Option("--provider", help="Only these providers.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the quote as JSON.")] = False,
) -> None:
    """What the job would cost, where, and why: ranked by expected job cost."""
    c = get_ctx(ctx)
    if json_out and not provider and _quote_json_through_service(c, job, top):
        return
    from broker.cli import render
    from broker.cli.backend import with_market
    from broker.errors import NoFeasibleOption
    from broker.specs import load_spec

    spec = load_spec(job)
    data = spec.model_dump(mode="json")
    q = with_market(c, lambda client: client.quote(data, top=top, max_rejected=None),
                    lambda book: book.quote(data, top=top, max_rejected=None), providers=provider)
    render.emit(q, json_out, lambda q: render.quote_table(q, explain=explain))
    if not q.options:
        raise NoFeasibleOption(f"no feasible option for {spec.name}: " + render.infeasible_reasons(q),
                               q.rejected_counts)


def _quote_json_through_service(c: Context, path: str, top: int) -> bool:
    """The quote's JSON as the server or the background broker made it (broker/cli/quick.py)."""
    from broker.cli.quick import through_service

    return through_service(c.server, c.token, None if c.server else c.quick_broker(), path, top)
