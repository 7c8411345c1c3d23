"""`lockstep gpus`: which GPU models are to be had, where, how many, at what price range per market."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from broker.cli import render
from broker.cli.app import get_ctx
from broker.cli.backend import with_market
from broker.errors import SpecError
from broker.gpus import resolve_request
from broker.models import GpuSummary

MAX_REGIONS_SHOWN = 6


def gpus(
    ctx: typer.Context,
    gpu: Annotated[list[str] | None, typer.Option("--gpu", help="Only this model or family (repeatable).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """GPU models in the current offer book: markets, regions, units and $/GPU-hour per market."""
    wanted = None
    if gpu:
        try:
            wanted = {m for name in gpu for m in resolve_request(name)}
        except ValueError as exc:
            raise SpecError("gpu", str(exc)) from None
    rows = with_market(get_ctx(ctx), lambda client: client.gpus(), lambda book: book.gpus())
    if wanted is not None:
        rows = [r for r in rows if r.gpu in wanted]
    render.emit(rows, json_out, _table)


def _regions(names: list[str]) -> str:
    more = len(names) - MAX_REGIONS_SHOWN
    return ", ".join(names[:MAX_REGIONS_SHOWN]) + (f" +{more}" if more > 0 else "")


def _table(rows: list[GpuSummary]) -> None:
    t = Table()
    for col in ("GPU", "vendor", "GB", "market", "offers", "GPUs", "$/GPU-h", "providers", "regions"):
        t.add_column(col, justify="right" if col in ("GB", "offers", "GPUs", "$/GPU-h") else "left")
    for r in rows:
        for k, m in enumerate(r.markets):
            price = f"${m.min_usd_per_gpu_hour:,.2f}" + (
                f"–{m.max_usd_per_gpu_hour:,.2f}" if m.max_usd_per_gpu_hour > m.min_usd_per_gpu_hour else "")
            t.add_row(r.gpu if k == 0 else "", r.vendor if k == 0 else "", f"{r.memory_gb:g}" if k == 0 else "",
                      m.market.value, f"{m.offers:,}", f"{m.gpus:,}", price, ", ".join(m.providers),
                      _regions(m.regions))
    render.console.print(t)
    render.console.print(f"{len(rows)} GPU model(s), {sum(r.offers for r in rows):,} offers")
