"""The metrics role: a Prometheus scraper's token reads /metrics and nothing else, over every route of the table."""

from __future__ import annotations

import re

from broker.api.handlers import ROUTES
from broker.models import Role
from tests.api.conftest import Api, spec


def _concrete(path: str) -> str:
    return re.sub(r"{\w+}", "x", path)


def test_metrics_token_scrapes_metrics_and_is_refused_everywhere_else(api: Api) -> None:
    with api.client(api.admin) as admin:
        made = admin.post("/v1/tokens", json={"tenant": "ops", "role": "metrics", "label": "prometheus"})
        assert made.status_code == 201, made.text
        assert made.json()["role"] == "metrics"
        scraper_token = made.json()["token"]

    allowed, refused = [], []
    with api.client(scraper_token) as scraper:
        for route in ROUTES:
            r = scraper.request(route.method, _concrete(route.path), json=spec() if route.body else None)
            if route.public or route.docs:  # answers anyone, token or not (docs: unless api.public_docs=false)
                assert r.status_code in (200, 503), (route.path, r.status_code)
            elif route.path == "/metrics":
                assert r.status_code == 200, r.text
                assert r.headers["Content-Type"].startswith("text/plain")
                assert "lockstep_http_requests_total" in r.text
                allowed.append(route.path)
            else:
                assert r.status_code == 403, (route.method, route.path, r.status_code, r.text)
                assert r.json()["error"]["code"] == "forbidden"
                refused.append((route.method, route.path))
        # A route outside the table is refused the same way: the role opens /metrics, nothing more.
        assert scraper.get("/v1/nothing-here").status_code == 403
    assert allowed == ["/metrics"]
    assert len(refused) == len([r for r in ROUTES if not (r.public or r.docs)]) - 1
    assert Role.metrics in next(r for r in ROUTES if r.path == "/metrics").roles
    assert all(Role.metrics not in r.roles for r in ROUTES if r.path != "/metrics")


def test_user_cannot_scrape_and_admin_can(api: Api) -> None:
    with api.client(api.alice) as alice, api.client(api.admin) as admin:
        r = alice.get("/metrics")
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        assert admin.get("/metrics").status_code == 200
