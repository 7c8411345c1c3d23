"""A spec without a workload (issue 29.1): ranked by $/h for the shape, hours unknown; the filters still apply."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.errors import SpecError
from broker.models import NO_WORKLOAD_NOTE, Fabric
from broker.specs import parse_spec
from policies.book import OfferBook
from policies.ranking import quote
from providers.catalog.offers import catalog_offers

NOW = datetime(2026, 6, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def book() -> OfferBook:
    return OfferBook.build(catalog_offers())


def test_no_workload_ranks_by_price_per_hour_and_leaves_hours_unknown(book: OfferBook) -> None:
    q = quote(book, parse_spec({"name": "x", "gpu": "H100:8"}), now=NOW, top=5)
    assert q.notes[0] == NO_WORKLOAD_NOTE
    assert q.options and all(o.expected_hours is None for o in q.options)
    prices = [o.usd_per_hour for o in q.options]
    assert prices == sorted(prices)
    assert [o.expected_cost_usd for o in q.options] == [round(p, 2) for p in prices]
    assert q.model_dump(mode="json")["options"][0]["expected_hours"] is None


def test_the_network_aware_constraints_still_filter(book: OfferBook) -> None:
    two_nodes = quote(book, parse_spec({"name": "x", "gpu": "H100:16"}), now=NOW, top=50)
    assert two_nodes.options and all(o.nodes == 2 for o in two_nodes.options)
    assert two_nodes.rejected_counts.get("nodes", 0) > 0  # single machines cannot hold 16 GPUs together
    ib = quote(book, parse_spec({"name": "x", "gpu": "H100:16", "fabric": "infiniband"}), now=NOW, top=50)
    assert all(o.fabric is Fabric.infiniband for o in ib.options)
    assert ib.rejected_counts.get("fabric", 0) > 0


@pytest.mark.parametrize("extra,named", [({"deadline_in": "48h"}, "deadline_in"),
                                         ({"deadline": "2027-01-01T00:00:00Z"}, "deadline"),
                                         ({"max_total_usd": 100}, "max_total_usd")])
def test_what_needs_a_job_length_needs_a_workload(extra: dict, named: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "x", "gpu": "H100:8", **extra})
    assert err.value.field == "workload" and named in str(err.value)
