"""Quotes, submissions, listing and the error contract through the real server."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from broker.models import Market, PricePoint, utcnow
from broker.store import open_store
from tests.api.conftest import Api, spec


def test_quote_ranks_options_with_reasons(api: Api) -> None:
    with api.client(api.alice) as alice:
        r = alice.post("/v1/quotes", params={"top": 3, "max_rejected": 5}, json=spec("q1"))
    assert r.status_code == 200, r.text
    q = r.json()
    assert 1 <= len(q["options"]) <= 3
    costs = [o["expected_cost_usd"] for o in q["options"]]
    assert costs == sorted(costs)
    assert len(q["rejected"]) <= 5 and all(x["reason"] for x in q["rejected"])
    assert sum(q["rejected_counts"].values()) + len(q["options"]) <= q["offers_considered"]


def test_quote_summarises_rejections_by_default_and_spells_them_out_on_request(api: Api) -> None:
    with api.client(api.alice) as alice:
        summary = alice.post("/v1/quotes", json=spec("q-default")).json()
        detailed = alice.post("/v1/quotes", params={"max_rejected": 4}, json=spec("q-default")).json()
        again = alice.post("/v1/quotes", json=spec("q-default")).json()
        other = alice.post("/v1/quotes", params={"top": 1}, json=spec("q-default")).json()
    assert summary["rejected"] == [] and sum(summary["rejected_counts"].values()) > 0
    assert len(detailed["rejected"]) == 4 and all(r["reason"] and r["code"] for r in detailed["rejected"])
    assert detailed["rejected_counts"] == summary["rejected_counts"]
    def picks(q: dict) -> list[tuple[str, float]]:  # the offers and their costs (each option's age moves on)
        return [(o["offer_id"], o["expected_cost_usd"]) for o in q["options"]]

    assert picks(detailed) == picks(summary)
    assert again == summary  # the same spec on the same book within a second: the same answer
    assert picks(other) == picks(summary)[:1]  # top is part of what is reused


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (spec(gpus=12, gpus_per_node=8), "gpus_per_node"),
        (spec(gpu=["Z9000 <script>"]), "gpu"),  # garbage; a GPU-shaped unknown name is a quote (issue 17)
        (spec(colour="blue"), "colour"),
        (spec(gpus=0), "gpus"),
        (spec(workload={"params_b": 7}), "workload"),
        ({"name": "x", "gpu": ["H100"], "gpus": 1, "deadline_in": "48h"}, "workload"),  # no workload: $/h, no deadline
        (spec(fabric="carrier-pigeon"), "fabric"),
        ([1, 2, 3], "body"),
    ],
)
def test_bad_specs_are_422_naming_the_field(api: Api, body: object, field: str) -> None:
    with api.client(api.alice) as alice:
        for path in ("/v1/quotes", "/v1/jobs"):
            r = alice.post(path, json=body)
            assert r.status_code == 422, (path, r.text)
            err = r.json()["error"]
            assert err["code"] == "invalid_spec" and err["field"] == field and err["message"]


def test_malformed_requests_are_400_never_500(api: Api) -> None:
    with api.client(api.alice) as alice:
        r = alice.post("/v1/quotes", content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"] == {
            "code": "bad_json", "message": "the body is not valid JSON", "field": "body"}
        assert alice.post("/v1/jobs", content=b"").json()["error"]["field"] == "body"
        nan = alice.post("/v1/quotes", content=b'{"name": "x", "gpus": NaN}')
        assert nan.status_code == 400
        r = alice.get("/v1/offers", params={"min_gpus": "lots"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "min_gpus"
        r = alice.get("/v1/jobs", params={"cursor": "bm90LWEtY3Vyc29y"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "cursor"
        r = alice.get("/v1/jobs", params={"state": "sleeping"})
        assert r.status_code == 400 and r.json()["error"]["field"].startswith("state")
        r = alice.post("/v1/jobs", json=spec(), headers={"Idempotency-Key": "x" * 300})
        assert r.status_code == 400 and r.json()["error"]["field"] == "Idempotency-Key"
        r = alice.put("/v1/jobs")
        assert r.status_code == 405 and "GET" in r.headers["Allow"]
        assert r.json()["error"]["code"] == "method_not_allowed"


def test_idempotent_retry_returns_the_same_job(api: Api) -> None:
    with api.client(api.alice) as alice, api.client(api.bob) as bob:
        key = {"Idempotency-Key": "retry-me-7f1"}
        first = alice.post("/v1/jobs", json=spec("idem"), headers=key)
        again = alice.post("/v1/jobs", json=spec("idem"), headers=key)
        assert (first.status_code, again.status_code) == (201, 200)
        assert again.json()["id"] == first.json()["id"]
        assert first.headers["Location"] == f"/v1/jobs/{first.json()['id']}"

        other = alice.post("/v1/jobs", json=spec("idem", gpus=16), headers=key)
        assert other.status_code == 409 and other.json()["error"]["code"] == "conflict"
        # Keys belong to a tenant: another tenant's same key is a new job.
        theirs = bob.post("/v1/jobs", json=spec("idem"), headers=key)
        assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]
        # Without a key every POST is a new job.
        a = alice.post("/v1/jobs", json=spec("nokey")).json()["id"]
        b = alice.post("/v1/jobs", json=spec("nokey")).json()["id"]
        assert a != b


def test_jobs_are_paginated_and_filtered_by_state(api: Api) -> None:
    with api.client(api.admin) as admin:
        admin.post("/v1/tenants", json={"name": "epsilon"})
        token = admin.post("/v1/tokens", json={"tenant": "epsilon"}).json()["token"]
    with api.client(token) as eps:
        ids = [eps.post("/v1/jobs", json=spec(f"page-{i}")).json()["id"] for i in range(5)]
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            page = eps.get("/v1/jobs", params=params).json()
            assert len(page["jobs"]) <= 2
            seen += [j["id"] for j in page["jobs"]]
            pages += 1
            cursor = page["next_cursor"]
            if not cursor:
                break
        assert pages == 3
        assert seen == list(reversed(ids))  # newest first, each once

        assert eps.delete(f"/v1/jobs/{ids[1]}").json()["state"] == "cancelled"
        assert eps.delete(f"/v1/jobs/{ids[1]}").json()["state"] == "cancelled"  # cancelling twice is harmless
        cancelled = eps.get("/v1/jobs", params={"state": "cancelled"}).json()["jobs"]
        assert [j["id"] for j in cancelled] == [ids[1]]
        both = eps.get("/v1/jobs", params=[("state", "cancelled"), ("state", "pending")]).json()["jobs"]
        assert len(both) == 5


def test_oversized_body_is_413(api: Api) -> None:
    big = json.dumps(spec(command="x" * (api.settings.api.max_body_bytes + 10)))
    with api.client(api.alice) as alice:
        r = alice.post("/v1/jobs", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large" and r.json()["error"]["field"] == "body"


def test_rate_limit_is_per_tenant(tight_api: Api) -> None:
    with tight_api.client(tight_api.alice) as alice, tight_api.client(tight_api.bob) as bob:
        assert [alice.get("/v1/offers", params={"limit": 1}).status_code for _ in range(3)] == [200] * 3
        limited = alice.get("/v1/offers", params={"limit": 1})
        assert limited.status_code == 429
        assert limited.json()["error"]["code"] == "rate_limited"
        assert int(limited.headers["Retry-After"]) >= 1
        assert bob.get("/v1/offers", params={"limit": 1}).status_code == 200  # another tenant, its own bucket
    with tight_api.client(None) as anon:
        assert anon.get("/healthz").status_code == 200  # probes are never throttled


def test_offers_and_prices_and_providers(api: Api) -> None:
    with api.client(api.bob) as bob:
        offers = bob.get("/v1/offers", params=[("gpu", "H100"), ("min_gpus", "8"), ("limit", "5")]).json()
        assert 1 <= len(offers) <= 5
        assert all(o["gpu"].startswith("H100") and o["gpu_count"] >= 8 for o in offers)
        per_gpu = [o["usd_per_hour"] / o["gpu_count"] for o in offers]
        assert per_gpu == sorted(per_gpu)
        assert bob.get("/v1/offers", params={"gpu": "Z9000 <script>"}).json()["error"]["field"] == "gpu"
        assert bob.get("/v1/offers", params={"gpu": "Z9000"}).json() == []  # GPU-shaped, offered nowhere

        assert bob.get("/v1/prices/history", params={"gpu": "H100", "limit": 10}).status_code == 200
        bad = bob.get("/v1/prices/history", params={"since": "yesterday-ish"})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "since"

        report = bob.get("/v1/providers").json()
        assert report["providers"]["catalog"]["ok"] is True
        assert report["providers"]["catalog"]["offers"] > 0 and report["refreshed_at"]


def test_health_readiness_and_metrics(api: Api) -> None:
    with api.client(None) as anon, api.client(api.admin) as admin, api.client(api.alice) as alice:
        assert anon.get("/healthz").json()["status"] == "ok"
        ready = anon.get("/readyz").json()
        assert ready["status"] == "ready" and ready["store"] is True
        alice.post("/v1/quotes", json=spec("metrics"))
        alice.post("/v1/jobs", json=spec("metrics"))
        r = admin.get("/metrics")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    text = r.text
    assert "lockstep_quote_seconds_count" in text
    assert 'lockstep_jobs{state="pending"}' in text
    assert 'lockstep_http_requests_total{method="POST",route="/v1/jobs",status="201"}' in text
    assert 'lockstep_provider_refreshes_total{outcome="ok",provider="catalog"}' in text
    pending = next(line for line in text.splitlines() if line.startswith('lockstep_jobs{state="pending"}'))
    assert float(pending.split()[-1]) >= 1


def test_price_history_and_series_serve_the_stored_points(api: Api) -> None:
    now = utcnow().replace(microsecond=0)
    points = [
        PricePoint(provider="aws", market=Market.spot, sku="p5.48xlarge", gpu="H100-SXM", region="us-east-1",
                   zone=zone, usd_per_hour=price, at=now - timedelta(hours=hours_ago))
        for zone, price, hours_ago in (("us-east-1a", 30.0, 30), ("us-east-1a", 33.5, 2), ("us-east-1b", 29.0, 1),
                                       ("us-east-1a", 20.0, 24 * 9))  # the last one is older than a week
    ]
    with open_store(api.db_url) as store:
        store.add_price_points(points)
    with api.client(api.bob) as bob:
        flat = bob.get("/v1/prices/history", params={"gpu": "H100-SXM", "zone": "us-east-1a"}).json()
        assert [p["usd_per_hour"] for p in flat] == [20.0, 30.0, 33.5]
        series = bob.get("/v1/prices/series", params={"gpu": "H100", "market": "spot"}).json()
        assert [(s["zone"], s["usd_per_hour"]) for s in series] == [("us-east-1a", [30.0, 33.5]),
                                                                     ("us-east-1b", [29.0])]
        assert datetime.fromisoformat(series[1]["at"][0]) == now - timedelta(hours=1)
        assert series[0]["sku"] == "p5.48xlarge" and series[0]["count"] == [None, None]
        ten_days = (now - timedelta(days=10)).isoformat()
        older = bob.get("/v1/prices/series", params={"gpu": "H100-SXM", "since": ten_days})
        assert older.json()[0]["usd_per_hour"] == [20.0, 30.0, 33.5]
        assert bob.get("/v1/prices/series", params={"gpu": "B200"}).json() == []
        week_before = (now - timedelta(days=8)).isoformat()  # the week before it: the old point alone
        assert [s["usd_per_hour"] for s in bob.get("/v1/prices/series", params={"until": week_before}).json()] \
            == [[20.0]]
        bad = bob.get("/v1/prices/series", params={"until": "soon"})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "until"


def test_price_filters_are_one_model_on_both_routes(api: Api) -> None:
    now = utcnow().replace(microsecond=0)
    points = [PricePoint(provider="aws", market=Market.spot, sku="g6e.xlarge", gpu="L40S", region="us-west-2",
                         zone=zone, usd_per_hour=price, at=now - timedelta(hours=hours_ago))
              for zone, price, hours_ago in (("us-west-2a", 1.0, 3), ("us-west-2a", 1.2, 2), ("us-west-2b", 0.9, 1))]
    with open_store(api.db_url) as store:
        store.add_price_points(points)
    with api.client(api.bob) as bob:
        newest = bob.get("/v1/prices/series", params={"gpu": "L40S", "limit": 2}).json()
        assert [(s["zone"], s["usd_per_hour"]) for s in newest] == [("us-west-2a", [1.2]), ("us-west-2b", [0.9])]
        flat = bob.get("/v1/prices/history", params={"gpu": "L40S", "limit": 2}).json()
        assert [p["usd_per_hour"] for p in flat] == [1.2, 0.9]
        for path in ("/v1/prices/series", "/v1/prices/history"):
            for params, field in (({"limit": 0}, "limit"), ({"since": "1700000000"}, "since"),
                                  ({"market": "black"}, "market"), ({"gpu": "x" * 65}, "gpu")):
                r = bob.get(path, params=params)
                assert r.status_code == 400 and r.json()["error"]["field"] == field, (path, params, r.text)


def test_logs_of_a_job_not_placed_yet_and_the_route_in_the_document(api: Api) -> None:
    with api.client(api.alice) as alice, api.client(api.bob) as bob:
        job = alice.post("/v1/jobs", json=spec("logs-pending")).json()
        r = alice.get(f"/v1/jobs/{job['id']}/logs")
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        assert r.text == ""  # nothing launched, nothing printed
        assert bob.get(f"/v1/jobs/{job['id']}/logs").status_code == 404  # another tenant's job
        assert alice.get("/v1/jobs/j-nope/logs", params={"follow": "true"}).status_code == 404
        bad = alice.get(f"/v1/jobs/{job['id']}/logs", params={"tail": "lots"})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "tail"
        assert job["spent_usd"] == 0 and job["accruing_usd"] == 0
        doc = alice.get("/openapi.json").json()
    op = doc["paths"]["/v1/jobs/{job_id}/logs"]["get"]
    assert {p["name"] for p in op["parameters"]} == {"job_id", "tail", "follow"}
    content = op["responses"]["200"]["content"]["application/x-ndjson"]
    assert content["x-itemSchema"] == {"$ref": "#/components/schemas/LogLine"}
    assert "404" in op["responses"] and "401" in op["responses"]
    assert "month_to_date_usd" in doc["components"]["schemas"]["Tenant"]["properties"]
