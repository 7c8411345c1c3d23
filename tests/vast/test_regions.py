"""Vast offers' regions from their geolocation (issue 17, item 5): a Vast region is the country (ISO code, as
Vast's own search filters it), so a job's ``regions`` and its data's location (``vast:US``) count for them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from broker.models import Market
from broker.specs import parse_spec
from policies.assembly import member_ids
from policies.book import OfferBook
from policies.ranking import quote
from providers.base import OfferQuery
from providers.vast import VastProvider
from providers.vast.config import VastConfig
from providers.vast.offers import country_of
from standins.vastapi.server import VastApiServer

NOW = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize(("geo", "region"), [
    ("Texas, US", "US"), ("US, California", "US"), ("quebec, ca", "CA"), ("Germany", "DE"),
    ("Sweden, SE", "SE"), ("United States", "US"), ("US", "US"), ("", ""), (None, ""), ("Atlantis", ""),
])
def test_a_region_is_the_country_code_in_the_geolocation(geo: object, region: str) -> None:
    assert country_of(geo) == region


async def test_data_location_and_regions_count_for_vast_machines(vast_api: VastApiServer, vast_config: VastConfig):
    provider = VastProvider(vast_config)
    try:
        offers = await provider.offers(OfferQuery(markets=[Market.on_demand]))
    finally:
        await provider.aclose()
    regions = {o.region for o in offers}
    assert "" not in regions and {"US", "DE"} <= regions  # every ask of the local market has one

    book = replace(OfferBook.build(offers), assemblers=frozenset({"vast"}))
    spec = parse_spec({"name": "d", "gpu": "RTX-4090", "gpus": 1, "workload": {"hours": 1},
                       "data": {"location": "vast:US", "size_gb": 500}})
    q = quote(book, spec, now=NOW, top=len(offers))
    egress = {o.region: o.breakdown.egress_usd for o in q.options}
    assert egress["US"] == 0.0  # the data is in that country: nothing leaves it
    assert all(cost > 0 for region, cost in egress.items() if region != "US"), egress  # elsewhere pays
    # The cheapest option overall is in the data's country once the egress counts.
    assert q.options[0].region == "US"

    # regions: [DE] keeps a job (and every machine an assembly takes) in Germany.
    two = parse_spec({"name": "d2", "gpu": "RTX-4090", "gpus": 2, "gpus_per_node": 1, "colocate": "region",
                      "regions": ["DE"], "workload": {"hours": 1}})
    q2 = quote(book, two, now=NOW, top=10)
    assert q2.options and all(o.region == "DE" for o in q2.options)
    by_id = {o.id: o for o in offers}
    assert all(by_id[m].region == "DE" for o in q2.options for m in member_ids(o.offer_id))
