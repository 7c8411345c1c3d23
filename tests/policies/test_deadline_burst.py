"""A deadline burst says why in numbers (issue 29): with the on-prem pool busy, the quote rejects its nodes as
`deadline`, and the placement still weighs them: the event carries the on-prem wait, the deadline and both costs."""

from __future__ import annotations

from datetime import UTC, datetime

from broker.models import Market, Offer
from broker.specs import parse_spec
from policies.book import OfferBook
from policies.placement import Route, decide
from policies.ranking import quote
from providers.catalog.offers import catalog_offers

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def busy_onprem(like: Offer, wait_h: float) -> Offer:
    """An on-prem node like a cloud one, cheaper, behind a queue of ``wait_h`` hours."""
    return like.model_copy(update={"id": "slurm:gpu-node-01", "provider": "slurm", "market": Market.owned,
                                   "usd_per_hour": like.usd_per_hour / 4, "queue_wait_hours": wait_h,
                                   "observed_at": NOW})


def test_a_deadline_burst_carries_the_wait_the_deadline_and_both_costs() -> None:
    cloud = [o for o in catalog_offers() if o.market is Market.on_demand and o.gpu == "H100-SXM"
             and o.gpu_count == 8 and o.provider == "aws"]
    book = OfferBook.build([*cloud, busy_onprem(cloud[0], wait_h=30)])
    spec = parse_spec({"name": "j", "gpu": "H100-SXM:8", "workload": {"hours": 10}, "deadline_in": "20h"})
    q = quote(book, spec, now=NOW)
    assert q.rejected_counts.get("deadline") == 1 and all(o.market is Market.on_demand for o in q.options)
    late = q.late_onprem
    assert late is not None and late.market is Market.owned and late.expected_hours == 40

    deadline = spec.deadline_at(NOW)
    d = decide(spec, q.options, now=NOW, deadline=deadline, max_queue_wait_hours=100, late_onprem=late)
    assert d.route is Route.cloud and d.reason == "burst: on-prem queue would miss the deadline"
    n = d.numbers
    assert n["onprem_queue_wait_hours"] == 30 and n["onprem_finish_hours"] == 40 and n["hours_to_deadline"] == 20
    assert n["deadline"] == "2026-11-30T08:00:00+00:00"
    assert n["cloud_cost_usd"] == q.options[0].expected_cost_usd and n["onprem_cost_usd"] == late.expected_cost_usd
    assert n["extra_cost_usd"] == round(q.options[0].expected_cost_usd - late.expected_cost_usd, 2)

    # Without the rejected on-prem option (today's main) the reason had no numbers.
    bare = decide(spec, q.options, now=NOW, deadline=deadline, max_queue_wait_hours=100)
    assert bare.reason == "no on-prem capacity fits this job" and "onprem_queue_wait_hours" not in bare.numbers


def test_a_job_that_must_stay_on_prem_still_waits() -> None:
    cloud = [o for o in catalog_offers() if o.market is Market.on_demand and o.gpu == "H100-SXM"
             and o.gpu_count == 8 and o.provider == "aws"]
    book = OfferBook.build([*cloud, busy_onprem(cloud[0], wait_h=30)])
    spec = parse_spec({"name": "j", "gpu": "H100-SXM:8", "workload": {"hours": 10}, "deadline_in": "20h",
                       "onprem_only": True})
    q = quote(book, spec, now=NOW)
    d = decide(spec, q.options, now=NOW, deadline=spec.deadline_at(NOW), max_queue_wait_hours=100,
               late_onprem=q.late_onprem)
    assert d.route is Route.wait
