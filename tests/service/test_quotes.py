"""The API's quote text: reused for an identical request on the same book, never across books."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from broker.config import Settings
from broker.models import Quote, QuoteOption
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


async def test_quote_text_is_what_pydantic_writes_for_the_validated_quote() -> None:
    """The API's text is written from the ranking's values without a model (orjson): validating it as a
    Quote and writing that back must give the same document — same fields, same values, same types —
    and the model the service hands Python callers (built without validation) must write it too."""
    at = datetime(2026, 5, 1, 12, 0, 0, 250_000, tzinfo=UTC)
    svc = Lockstep(Settings(db_url="sqlite://"), providers={"catalog": CatalogProvider()}, clock=lambda: at)
    specs = [SPEC, parse_spec({"name": "any", "gpu": "any", "gpus": 1, "min_gpu_memory_gb": 24, "interruptible": True,
                               "workload": {"params_b": 7, "tokens_b": 1}, "data": {"location": "aws:us-west-2",
                                                                                   "size_gb": 300}}),
             parse_spec({"name": "none", "gpu": "B300", "gpus": 64, "gpus_per_node": 8, "max_usd_per_hour": 1,
                        "workload": {"hours": 2}})]
    try:
        for spec in specs:
            for max_rejected in (0, 5, None):
                text = await svc.quote_json(spec, max_rejected=max_rejected)
                doc = json.loads(text)
                assert doc == json.loads(Quote.model_validate_json(text).model_dump_json())
                assert doc == json.loads((await svc.quote(spec, max_rejected=max_rejected)).model_dump_json())
                assert list(doc) == list(Quote.model_fields)  # in the model's order
                assert doc["at"] == "2026-05-01T12:00:00.250000Z"
                for option in doc["options"]:
                    assert list(option) == list(QuoteOption.model_fields)
        assert doc["rejected"] and doc["rejected_counts"]
    finally:
        await svc.aclose()
