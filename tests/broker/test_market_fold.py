"""A large book is folded by shape as the market makes it (off the event loop), so the first `gpu: any`
quote finds the view ready; a small one never is."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from broker.market import Marketplace
from broker.models import Locality, Market, Offer
from policies.book import PRUNE_MIN_ROWS
from standins.memory import MemoryProvider

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def offers(n: int) -> list[Offer]:
    return [Offer(id=f"m{i}", provider="mem", market=Market.on_demand, sku="1xL40S", gpu="L40S", gpu_count=1,
                  usd_per_hour=1.0 + (i % 50) / 100, locality=Locality(provider="mem", region="r1", zone=f"z{i % 3}"),
                  observed_at=NOW) for i in range(n)]


async def test_a_large_book_is_folded_as_it_is_made_and_a_small_one_is_not() -> None:
    for n, folded in ((PRUNE_MIN_ROWS, True), (50, False)):
        market = Marketplace({"mem": MemoryProvider("mem", offers(n))}, clock=lambda: NOW)
        await market.refresh()
        book = market.book()
        for t in threading.enumerate():
            if t.name == "lockstep-fold-book":
                t.join(timeout=120)  # a bounded wait for the event, not a timing
        assert (book._pruned is not None) is folded
        if folded:
            view = book._pruned
            assert len(view.reps) == 1  # one shape: prices differ, zones only name an offer
            assert view.size.tolist() == [n] and book.ids[view.members[0]] == "m0"  # the cheapest first
