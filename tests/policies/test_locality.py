"""Data location without provider names (issue 13): 'onprem' is the owned market, a site is what offers
name in their locality, and egress is what the data's site declares (or the spec says)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.models import Colocate, Locality, Market, Offer
from broker.specs import parse_spec
from policies.book import OfferBook
from policies.ranking import CROSS_REGION_USD_PER_GB, DEFAULT_EGRESS_USD_PER_GB, parse_location, quote

NOW = datetime(2026, 12, 1, tzinfo=UTC)
SIZE_GB = 1000


def offer(oid: str, site: str, region: str, market: Market = Market.on_demand, egress: float = 0.0) -> Offer:
    return Offer(id=oid, provider=f"adapter-{oid}", market=market, sku="8x", gpu="H100-SXM", gpu_count=8,
                 usd_per_hour=10.0, max_nodes=1, colocation=Colocate.node, egress_usd_per_gb=egress,
                 locality=Locality(provider=site, region=region))


def egress_by_offer(offers: list[Offer], location: str, **data: object) -> dict[str, float]:
    spec = parse_spec({"name": "d", "gpu": "H100", "gpus": 8, "workload": {"hours": 1},
                       "data": {"location": location, "size_gb": SIZE_GB, **data}})
    q = quote(OfferBook.build(offers), spec, now=NOW, top=len(offers))
    assert q.options
    return {o.offer_id: o.breakdown.egress_usd for o in q.options}


@pytest.mark.parametrize(("text", "site", "region"), [
    ("aws:us-east-1", "aws", "us-east-1"), ("onprem", "onprem", ""), ("On-Prem:dc2", "onprem", "dc2"),
    ("owned", "onprem", ""), ("neocloud:eu", "neocloud", "eu"), ("", "", ""),
])
def test_locations_parse_to_a_site_and_a_region(text: str, site: str, region: str) -> None:
    assert parse_location(text) == (site, region)


def test_onprem_means_the_owned_market_whatever_the_adapter_is_called() -> None:
    offers = [offer("rack", "campus", "b1", market=Market.owned), offer("cloud", "bigcloud", "r1", egress=0.05)]
    costs = egress_by_offer(offers, "onprem")
    # Data on-prem: free on owned hardware; leaving through the owned sites' own (here undeclared: 0) price.
    assert costs == {"rack": 0.0, "cloud": 0.0}
    spec = parse_spec({"name": "d", "gpu": "H100", "gpus": 8, "workload": {"hours": 1},
                       "data": {"location": "onprem", "size_gb": SIZE_GB}})
    q = quote(OfferBook.build(offers), spec, now=NOW, top=2)
    hours = {o.offer_id: o.breakdown.compute_hours for o in q.options}
    assert q.options[0].offer_id == "rack" and hours  # the cloud offer also pays the transfer time
    assert next(o for o in q.options if o.offer_id == "cloud").expected_hours > 1.0


def test_egress_comes_from_the_data_sites_offers_not_a_table_of_names() -> None:
    offers = [offer("same", "bigcloud", "r1", egress=0.05), offer("other-region", "bigcloud", "r2", egress=0.05),
              offer("elsewhere", "market", "EU")]
    assert egress_by_offer(offers, "bigcloud:r1") == {
        "same": 0.0,
        "other-region": SIZE_GB * min(0.05, CROSS_REGION_USD_PER_GB),
        "elsewhere": SIZE_GB * 0.05,  # what bigcloud's own offers declare
    }
    # A site no offer declares a price for: the default internet egress.
    assert egress_by_offer(offers, "somewhere:x")["elsewhere"] == SIZE_GB * DEFAULT_EGRESS_USD_PER_GB
    # The spec knows its storage's price best.
    assert egress_by_offer(offers, "bigcloud:r1", egress_usd_per_gb=0.011)["elsewhere"] == pytest.approx(11.0)
