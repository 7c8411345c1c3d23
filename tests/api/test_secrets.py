"""Tokens and provider keys never come back in a response and never reach a log."""

from __future__ import annotations

from tests.api.conftest import FAKE_VAST_KEY, Api, _Collector, spec


def test_no_secret_in_responses_or_logs(api: Api, captured_logs: _Collector) -> None:
    forged = "lst_forged-" + "y" * 40
    bodies: list[str] = []
    with api.client(api.admin) as admin, api.client(api.alice) as alice, api.client(forged) as bad:
        bodies += [
            admin.get("/v1/providers").text,
            admin.get("/metrics").text,
            admin.get("/openapi.json").text,
            admin.get("/v1/tokens").text,
            admin.get("/v1/tenants").text,
            alice.post("/v1/quotes", json=spec("secrets"), params={"top": 2, "max_rejected": 3}).text,
            alice.post("/v1/jobs", json=spec("secrets")).text,
            alice.post("/v1/jobs", json=spec(gpus=7, gpus_per_node=2)).text,
            alice.get("/v1/jobs/nope").text,
            alice.get("/metrics").text,
            bad.get("/v1/jobs").text,
            bad.post("/v1/quotes", json=spec()).text,
        ]
        fresh = admin.post("/v1/tokens", json={"tenant": "theta"}).json()
        assert admin.delete(f"/v1/tokens/{fresh['id']}").status_code == 204
        with api.client(fresh["token"]) as revoked:
            bodies.append(revoked.get("/v1/jobs").text)

    secrets = [*api.secrets, forged, fresh["token"], FAKE_VAST_KEY]
    for body in bodies:
        for secret in secrets:
            assert secret not in body
    assert captured_logs.lines, "the session's server logged nothing: the capture is not working"
    assert any("lockstep.access" in line for line in captured_logs.lines)  # the access log is captured too
    for line in captured_logs.lines:
        for secret in secrets:
            assert secret not in line, line
