"""`lockstep offers`."""

from __future__ import annotations

from typing import Annotated

import typer

from broker.cli import render
from broker.cli.app import get_ctx
from broker.cli.backend import validated, with_market
from broker.models import FabricNeed, Market


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
