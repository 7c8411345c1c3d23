"""The API's quote text: reused for an identical request on the same book, never across books."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from broker.config import Settings
from broker.service import Lockstep
from broker.specs import parse_spec
from providers.catalog import CatalogProvider

SPEC = parse_spec({"name": "q", "gpu": "H100", "gpus": 8, "workload": {"hours": 1}})


async def test_quote_text_is_reused_on_one_book_and_ranked_again_on_the_next() -> None:
    ticks = iter(datetime(2026, 5, 1, tzinfo=UTC) + timedelta(seconds=i) for i in range(100))
    svc = Lockstep(Settings(db_url="sqlite://"), providers={"catalog": CatalogProvider()}, clock=lambda: next(ticks))
    try:
        first = await svc.quote_json(SPEC)
        assert await svc.quote_json(SPEC) == first  # same spec, same book: not ranked again
        assert json.loads(await svc.quote_json(SPEC, max_rejected=3))["rejected"]  # another request: ranked
        await svc.refresh()  # a new book
        fresh = await svc.quote_json(SPEC)
        assert json.loads(fresh)["at"] > json.loads(first)["at"]
        def picks(text: str) -> list[tuple[str, float]]:  # the same offers at the same costs (ages move on)
            return [(o["offer_id"], o["expected_cost_usd"]) for o in json.loads(text)["options"]]

        assert picks(fresh) == picks(first)
        q = await svc.quote(SPEC)  # the model, always ranked
        assert q.options and q.at > datetime.fromisoformat(json.loads(fresh)["at"])
    finally:
        await svc.aclose()
