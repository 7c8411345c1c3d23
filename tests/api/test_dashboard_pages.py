"""The dashboard's pages over HTTP (the browser test is tests/dashboard): the session cookie, who sees what, every
page answering, a revoked token ending the session, and the price chart drawn from recorded series."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import httpx

from broker.dashboard.pages import _chart
from broker.models import Market, PriceSeries, Role
from broker.store import open_store
from tests.api.conftest import Api, spec


@contextmanager
def _session(api: Api, token: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=60) as c:
        r = c.post("/ui/login", data={"token": token})
        assert r.status_code == 302 and r.headers["location"] == "/ui/", r.text
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
        yield c


def test_who_sees_what(api: Api) -> None:
    with api.client(api.alice) as alice, api.client(api.bob) as bob:
        mine = alice.post("/v1/jobs", json=spec("ui-page-a")).json()["id"]
        theirs = bob.post("/v1/jobs", json=spec("ui-page-b")).json()["id"]
    with httpx.Client(base_url=api.url, timeout=60) as anonymous:
        assert anonymous.get("/ui/").status_code == 302  # to the login page
        assert anonymous.get(f"/ui/jobs/{mine}/log").status_code == 401
        bad = anonymous.post("/ui/login", data={"token": "lst_forged"})
        assert bad.status_code == 401 and "unknown" in bad.text and "lst_forged" not in bad.text
    with _session(api, api.alice) as alice:
        page = alice.get("/ui/").text
        assert mine in page and theirs not in page
        assert alice.get(f"/ui/jobs/{theirs}").status_code == 404
        assert alice.get(f"/ui/jobs/{mine}").status_code == 200
        tenants = alice.get("/ui/tenants").text
        assert 'data-tenant="alpha"' in tenants and 'data-tenant="beta"' not in tenants
        for path in ("/ui/offers", "/ui/offers?gpu=H100", "/ui/prices?gpu=H100", "/ui/providers",
                     "/ui/static/ui.css", "/ui/static/log.js"):
            assert alice.get(path).status_code == 200, path
        assert alice.post("/ui/logout").status_code == 302
    with _session(api, api.admin) as admin:
        page = admin.get("/ui/").text
        assert mine in page and theirs in page
        tenants = admin.get("/ui/tenants").text
        assert 'data-tenant="alpha"' in tenants and 'data-tenant="beta"' in tenants


def test_a_revoked_token_ends_the_session(api: Api) -> None:
    with open_store(api.db_url) as store:
        info, token = store.create_token("gamma", Role.user, "ui")
    with _session(api, token) as c:
        assert c.get("/ui/").status_code == 200
        with api.client(api.admin) as admin:
            assert admin.delete(f"/v1/tokens/{info.id}").status_code == 204
        assert c.get("/ui/").status_code == 302


def test_the_price_chart_draws_each_series() -> None:
    at = datetime(2026, 11, 30, tzinfo=UTC)
    s = [PriceSeries(provider="aws", market=Market.spot, sku="p5.48xlarge", gpu="H100", zone="us-east-1a",
                     at=[at, at + timedelta(hours=1), at + timedelta(hours=2)], usd_per_hour=[40.0, 60.0, 50.0],
                     count=[None] * 3)]
    chart = _chart(s)
    assert chart is not None and chart["top"] == 60.0 and chart["bottom"] == 40.0
    [line] = chart["lines"]
    xs = [float(p.split(",")[0]) for p in line["points"].split()]
    ys = [float(p.split(",")[1]) for p in line["points"].split()]
    assert xs[0] == 50.0 and xs == sorted(xs) and min(ys) == ys[1]  # the peak is highest on the page
    assert _chart([]) is None
