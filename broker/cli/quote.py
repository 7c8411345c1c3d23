"""`lockstep quote` and `lockstep offers`."""

from __future__ import annotations

from typing import Annotated

import typer

from broker.cli import render
from broker.cli.app import get_ctx
from broker.cli.backend import validated, with_market
from broker.errors import NoFeasibleOption
from broker.models import FabricNeed, Market
from broker.specs import load_spec


def quote(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="Job spec file (YAML or JSON).")],
    top: Annotated[int, typer.Option(min=1, max=1000, help="How many options to show.")] = 10,
    explain: Annotated[bool, typer.Option("--explain", help="Also say why every other offer was rejected.")] = False,
    provider: Annotated[list[str] | None, typer.Option("--provider", help="Only these providers.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the quote as JSON.")] = False,
) -> None:
    """What the job would cost, where, and why: ranked by expected job cost."""
    spec = load_spec(job)
    data = spec.model_dump(mode="json")
    q = with_market(get_ctx(ctx), lambda client: client.quote(data, top=top, max_rejected=None),
                    lambda book: book.quote(data, top=top, max_rejected=None), providers=provider)
    render.emit(q, json_out, lambda q: render.quote_table(q, explain=explain))
    if not q.options:
        raise NoFeasibleOption(f"no feasible option for {spec.name}: " + render.infeasible_reasons(q),
                               q.rejected_counts)


def offers(
    ctx: typer.Context,
    gpu: Annotated[list[str] | None, typer.Option("--gpu", help="GPU model or family (repeatable).")] = None,
    min_gpus: Annotated[int | None, typer.Option("--min-gpus", min=1, help="GPUs per node at least.")] = None,
    fabric: Annotated[FabricNeed | None, typer.Option("--fabric", help="Fabric class at least.")] = None,
    market: Annotated[list[Market] | None, typer.Option("--market", help="Market kind (repeatable).")] = None,
    max_price: Annotated[float | None, typer.Option("--max-price", help="USD per node-hour at most.")] = None,
    provider: Annotated[list[str] | None, typer.Option("--provider", help="Provider (repeatable).")] = None,
    region: Annotated[str | None, typer.Option("--region")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Rows at most.")] = 50,
    json_out: Annotated[bool, typer.Option("--json", help="Print offers as JSON.")] = False,
) -> None:
    """The offer book, cheapest per GPU-hour first."""
    from policies.offers import OfferFilter

    f = validated(OfferFilter, gpu=gpu, min_gpus=min_gpus, fabric=fabric, market=market, max_price=max_price,
                  provider=provider, region=region)
    filters = f.model_dump(mode="json", exclude_none=True)
    # Every market's book (a server's, the broker's): --provider here filters offers, it builds no narrower book.
    result = with_market(get_ctx(ctx), lambda client: client.offers(limit=limit, **filters),
                         lambda book: book.offers(f, limit))
    render.emit(result, json_out, render.offers_table)
