"""Tokens, tenants and roles through the real server: who may see and do what."""

from __future__ import annotations

import re

from broker.api.handlers import ROUTES
from tests.api.conftest import Api, spec


def _concrete(path: str) -> str:
    return re.sub(r"{\w+}", "x", path)


def test_only_health_endpoints_answer_without_a_token(api: Api) -> None:
    with api.client(None) as anon, api.client("lst_not-a-real-token") as forged:
        for route in ROUTES:
            path = _concrete(route.path)
            for client in (anon, forged):
                r = client.request(route.method, path, json=spec() if route.body else None)
                if route.public or route.docs:
                    assert r.status_code == 200, (route.path, r.text)
                else:
                    assert r.status_code == 401, (route.method, route.path, r.status_code)
                    assert r.json()["error"]["code"] == "unauthorized"
                    assert r.headers["WWW-Authenticate"].startswith("Bearer")
        # Unknown routes do not tell an anonymous caller what exists either.
        assert anon.get("/v1/nothing-here").status_code == 401


def test_tenant_cannot_read_list_or_cancel_another_tenants_job(api: Api) -> None:
    with api.client(api.alice) as alice, api.client(api.bob) as bob, api.client(api.admin) as admin:
        created = alice.post("/v1/jobs", json=spec("alpha-private"))
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["tenant"] == "alpha"

        for r in (bob.get(f"/v1/jobs/{job['id']}"), bob.delete(f"/v1/jobs/{job['id']}")):
            assert r.status_code == 404  # not 403: ids must not leak
            assert r.json()["error"]["code"] == "not_found"
        bob_ids = {j["id"] for j in bob.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]}
        assert job["id"] not in bob_ids
        # An ordinary user cannot widen the view with ?tenant=.
        widened = bob.get("/v1/jobs", params={"tenant": "alpha", "limit": 1000}).json()["jobs"]
        bob_ids = {j["id"] for j in widened}
        assert job["id"] not in bob_ids

        # Still there and untouched for its owner; the admin sees it too.
        mine = alice.get(f"/v1/jobs/{job['id']}")
        assert mine.status_code == 200 and mine.json()["state"] == "pending"
        assert [e["to_state"] for e in mine.json()["events"]] == ["pending"]
        assert mine.json()["allocations"] == []
        assert admin.get(f"/v1/jobs/{job['id']}").status_code == 200
        all_ids = {j["id"] for j in admin.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]}
        assert job["id"] in all_ids

        cancelled = alice.delete(f"/v1/jobs/{job['id']}")
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"


def test_revoked_token_is_refused(api: Api) -> None:
    # A tenant no other test uses: the listing below is this test's token alone, whatever ran before.
    with api.client(api.admin) as admin:
        made = admin.post("/v1/tokens", json={"tenant": "revoked-only", "label": "short-lived"})
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["token"].startswith("lst_") and body["tenant"] == "revoked-only" and body["role"] == "user"
        listed = admin.get("/v1/tokens", params={"tenant": "revoked-only"}).json()
        assert [t["id"] for t in listed] == [body["id"]]
        assert "token" not in listed[0] and "token_hash" not in listed[0]

        with api.client(body["token"]) as gamma:
            assert gamma.get("/v1/jobs").status_code == 200
            assert admin.delete(f"/v1/tokens/{body['id']}").status_code == 204
            refused = gamma.get("/v1/jobs")
            assert refused.status_code == 401
            assert refused.json()["error"]["message"] == "invalid or revoked token"
        assert admin.get("/v1/tokens", params={"tenant": "revoked-only"}).json()[0]["revoked"] is True
        assert admin.delete("/v1/tokens/tok_doesnotexist").status_code == 404


def test_admin_endpoints_need_an_admin(api: Api) -> None:
    with api.client(api.alice) as alice:
        for method, path, body in (
            ("POST", "/v1/tokens", {"tenant": "alpha", "role": "admin"}),
            ("GET", "/v1/tokens", None),
            ("DELETE", "/v1/tokens/tok_x", None),
            ("POST", "/v1/tenants", {"name": "sneaky"}),
            ("GET", "/v1/tenants", None),
            ("PATCH", "/v1/tenants/alpha", {"monthly_budget_usd": 1e9}),
            ("POST", "/v1/nodes/catalog/node-1/drain", {"reason": "x"}),
            ("GET", "/metrics", None),
        ):
            r = alice.request(method, path, json=body)
            assert r.status_code == 403, (method, path, r.status_code)
            assert r.json()["error"]["code"] == "forbidden"


def test_tenants_and_budgets(api: Api) -> None:
    with api.client(api.admin) as admin, api.client(api.alice) as alice:
        made = admin.post("/v1/tenants", json={"name": "delta", "monthly_budget_usd": 5000, "max_gpus": 64})
        assert made.status_code == 201, made.text
        assert made.json()["monthly_budget_usd"] == 5000 and made.json()["max_gpus"] == 64
        assert admin.post("/v1/tenants", json={"name": "delta"}).status_code == 409

        patched = admin.patch("/v1/tenants/delta", json={"monthly_budget_usd": 7500.5})
        assert patched.status_code == 200
        assert patched.json()["monthly_budget_usd"] == 7500.5
        assert patched.json()["max_gpus"] == 64  # untouched
        cleared = admin.patch("/v1/tenants/delta", json={"max_gpus": None}).json()
        assert cleared["max_gpus"] is None and cleared["monthly_budget_usd"] == 7500.5
        assert "delta" in {t["name"] for t in admin.get("/v1/tenants").json()}
        assert admin.patch("/v1/tenants/nobody", json={"max_gpus": 1}).status_code == 404

        bad = admin.post("/v1/tenants", json={"name": "no spaces allowed"})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "name"
        negative = admin.patch("/v1/tenants/delta", json={"monthly_budget_usd": -1})
        assert negative.status_code == 422 and negative.json()["error"]["field"] == "monthly_budget_usd"

        # A user sees its own tenant (its caps) and no other.
        assert alice.get("/v1/tenants/alpha").status_code == 200
        assert alice.get("/v1/tenants/delta").status_code == 404


def test_drain_a_node(api: Api) -> None:
    with api.client(api.admin) as admin:
        r = admin.post("/v1/nodes/catalog/test-node-1/drain", json={"reason": "double-bit ECC errors"})
        assert r.status_code == 200, r.text
        assert r.json() == {"provider": "catalog", "node": "test-node-1", "healthy": False,
                            "reason": "double-bit ECC errors", "drained": False}
        missing = admin.post("/v1/nodes/nowhere/n1/drain", json={"reason": "x"})
        assert missing.status_code == 404
        empty = admin.post("/v1/nodes/catalog/n1/drain", json={"reason": ""})
        assert empty.status_code == 422 and empty.json()["error"]["field"] == "reason"


def test_tenant_and_token_rules_are_the_domain_models(api: Api) -> None:
    with api.client(api.admin) as admin:
        for body, field in (({"name": "kappa", "monthly_budget_usd": True}, "monthly_budget_usd"),
                            ({"name": "kappa", "max_gpus": 1.5}, "max_gpus"),
                            ({"name": "kappa", "colour": "red"}, "colour")):
            r = admin.post("/v1/tenants", json=body)
            assert r.status_code == 422 and r.json()["error"]["field"] == field, r.text
        r = admin.post("/v1/tokens", json={"tenant": "kappa", "label": "x" * 257})
        assert r.status_code == 422 and r.json()["error"]["field"] == "label"
        r = admin.patch("/v1/tenants/alpha", json={"max_gpus": False})
        assert r.status_code == 422 and r.json()["error"]["field"] == "max_gpus"
