"""The CLI as a client (--server) and the admin commands, each run as a real `lockstep` process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from broker.errors import ConflictError, LockstepError, NotFoundError, SpecError
from broker.sdk import AsyncClient
from tests.api.conftest import EXAMPLES, ROOT, Api, spec


def lockstep(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    # A clean environment: no LOCKSTEP_* from the developer's shell may change what is compared.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    if token:
        env["LOCKSTEP_TOKEN"] = token  # as users do, so it is not on the command line either
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)


def _without_time(quote: dict) -> dict:
    """The quote less what depends on when it was made: its time, and each option's age (taken from it)."""
    options = [{k: v for k, v in o.items() if k != "age_s"} for o in quote.get("options", [])]
    return {**{k: v for k, v in quote.items() if k != "at"}, "options": options}


@pytest.mark.parametrize("example", ["single-node-8gpu.yaml", "llama-70b-pretrain.yaml"])
def test_quote_json_is_the_same_through_the_server(api: Api, tmp_path: Path, example: str) -> None:
    job = str(EXAMPLES / example)
    local = lockstep("--db", str(tmp_path / "local.db"), "quote", "--provider", "catalog", "--json", job)
    remote = lockstep("--server", api.url, "quote", "--json", job, token=api.alice)
    assert local.returncode == remote.returncode == 0, (local.stderr, remote.stderr)
    ql, qr = json.loads(local.stdout), json.loads(remote.stdout)
    assert qr["options"], "the catalog has options for this example"
    assert _without_time(qr) == _without_time(ql)


def test_jobs_commands_through_the_server(api: Api) -> None:
    job = str(EXAMPLES / "single-node-8gpu.yaml")
    sub = lockstep("--server", api.url, "submit", "--json", "--idempotency-key", "cli-1", job, token=api.bob)
    assert sub.returncode == 0, sub.stderr
    submitted = json.loads(sub.stdout)
    assert submitted["tenant"] == "beta" and submitted["state"] == "pending"

    st = lockstep("--server", api.url, "status", "--json", submitted["id"], token=api.bob)
    assert st.returncode == 0 and json.loads(st.stdout)["id"] == submitted["id"]
    listed = lockstep("--server", api.url, "jobs", "--json", "--state", "pending", token=api.bob)
    assert submitted["id"] in {j["id"] for j in json.loads(listed.stdout)}

    # Another tenant: not found, exit 2 with one line.
    theirs = lockstep("--server", api.url, "status", submitted["id"], token=api.alice)
    assert theirs.returncode == 2 and "not found" in theirs.stderr
    assert len(theirs.stderr.strip().splitlines()) == 1

    gone = lockstep("--server", api.url, "cancel", "--json", submitted["id"], token=api.bob)
    assert gone.returncode == 0 and json.loads(gone.stdout)["state"] == "cancelled"


def test_a_bad_token_is_one_line_without_the_token(api: Api) -> None:
    forged = "lst_forged-" + "x" * 30
    r = lockstep("--server", api.url, "jobs", token=forged)
    assert r.returncode == 1
    assert "refused the token" in r.stderr and "Traceback" not in r.stderr
    assert forged not in r.stderr + r.stdout
    down = lockstep("--server", "http://127.0.0.1:9", "jobs", token=api.alice)
    assert down.returncode == 1 and "cannot reach" in down.stderr and api.alice not in down.stderr


async def test_the_cli_client_maps_errors(api: Api) -> None:
    """The CLI's way to a server is the SDK's AsyncClient: the server's errors come back as its classes."""
    backend = AsyncClient(api.url, api.alice)
    try:
        assert api.alice not in repr(backend)
        with pytest.raises(SpecError) as bad:
            await backend.quote(spec(gpus=12, gpus_per_node=8), top=3, max_rejected=None)
        assert bad.value.field == "gpus_per_node"
        with pytest.raises(NotFoundError):
            await backend.job("j-does-not-exist")
        await backend.submit(spec("remote-idem"), idempotency_key="remote-key")
        with pytest.raises(ConflictError):
            await backend.submit(spec("remote-idem", gpus=16), idempotency_key="remote-key")
    finally:
        await backend.aclose()
    anonymous = AsyncClient(api.url, None)
    try:
        with pytest.raises(LockstepError, match="refused the token"):
            await anonymous.jobs(limit=10)
    finally:
        await anonymous.aclose()


def test_admin_commands_on_the_servers_store(api: Api) -> None:
    db = api.db_url
    made = lockstep("--db", db, "tokens", "create", "--tenant", "zeta", "--label", "ci-bot")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    assert token.startswith("lst_") and " " not in token

    listed = json.loads(lockstep("--db", db, "tokens", "list", "--tenant", "zeta", "--json").stdout)
    assert len(listed) == 1 and listed[0]["label"] == "ci-bot" and token not in json.dumps(listed)

    budget = lockstep("--db", db, "tenants", "set-budget", "zeta", "--monthly-usd", "1234.5",
                      "--max-gpus", "16")
    assert budget.returncode == 0, budget.stderr
    tenants = {t["name"]: t for t in json.loads(lockstep("--db", db, "tenants", "list", "--json").stdout)}
    assert tenants["zeta"]["monthly_budget_usd"] == 1234.5 and tenants["zeta"]["max_gpus"] == 16
    with api.client(api.admin) as admin:  # the server reads the same store
        assert admin.get("/v1/tenants/zeta").json()["max_gpus"] == 16

    dup = lockstep("--db", db, "tenants", "create", "zeta", "--budget", "10")
    assert dup.returncode == 2 and "already exists" in dup.stderr
    bad = lockstep("--db", db, "tokens", "create", "--tenant", "no spaces")
    assert bad.returncode == 2 and "tenant" in bad.stderr

    # A token the server has never seen, revoked from the CLI, is refused at once.
    assert lockstep("--db", db, "tokens", "revoke", listed[0]["id"]).returncode == 0
    with api.client(token) as revoked:
        assert revoked.get("/v1/jobs").status_code == 401
    assert lockstep("--db", db, "tokens", "revoke", "tok_nope").returncode == 2


def test_serve_starts_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "--db", str(tmp_path / "serve.db"), "serve", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("lockstep: serving on http://127.0.0.1:"), line
        url = line.split()[-1]
        assert httpx.get(f"{url}/healthz", timeout=30).json()["status"] == "ok"
        ready = httpx.get(f"{url}/readyz", timeout=30)
        assert ready.status_code == 200 and ready.json()["store"] is True
        assert httpx.get(f"{url}/v1/jobs", timeout=30).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err
