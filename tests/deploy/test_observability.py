"""The Grafana dashboard and the Prometheus rules: valid PromQL (promtool), alerts that fire when they should
(promtool test rules), and every metric they use exported by a real `lockstep serve` scrape. Each check fails
on a deliberately broken copy.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT
from tests.deploy.tools import run, tool

PROM = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "lockstep.json"
METRIC = re.compile(r"\blockstep_[a-zA-Z0-9_]+\b")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("_count", "_sum", "_created"), "gauge": ("",), "info": ("_info",)}


def dashboard_exprs(dashboard: dict) -> list[str]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append(target["expr"])
        for sub in panel.get("panels", []):
            out.extend(t["expr"] for t in sub.get("targets", []))
    return out


def rule_exprs(rules: dict) -> list[str]:
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def used_metrics(exprs: list[str]) -> set[str]:
    return {m for e in exprs for m in METRIC.findall(e)}


def exported_names(scrape: str) -> set[str]:
    """Every series name a scrape can carry: each family's own name and its samples' names by type."""
    names: set[str] = set()
    for fam in text_string_to_metric_families(scrape):
        names.add(fam.name)
        names.update(fam.name + s for s in SUFFIXES.get(fam.type, ("",)))
        names.update(s.name for s in fam.samples)
    return names


def not_exported(exprs: list[str], scrape: str) -> set[str]:
    return used_metrics(exprs) - exported_names(scrape)


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """/metrics of a real `python -m broker serve` on port 0 (a fresh SQLite store), scraped as Prometheus
    does: with a token of the read-only metrics role."""
    tmp = tmp_path_factory.mktemp("serve")
    db = str(tmp / "metrics.db")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    made = subprocess.run([sys.executable, "-m", "broker", "--db", db, "tokens", "create", "--tenant", "ops",
                           "--role", "metrics"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    proc = subprocess.Popen([sys.executable, "-m", "broker", "--db", db, "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("lockstep: serving on "), line
        r = httpx.get(f"{line.split()[-1]}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert r.status_code == 200, r.text
        yield r.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


# --------------------------------------------------------------------------- promtool


def test_rules_check_and_their_unit_tests_pass() -> None:
    promtool = tool("promtool")
    for args in (["check", "rules", "alerts.yaml"], ["test", "rules", "alerts.test.yaml"],
                 ["check", "config", "--syntax-only", "prometheus.yml"]):
        r = run(promtool, *args, cwd=PROM)
        assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}{r.stderr}"


def test_broken_rules_fail_promtool(tmp_path: Path) -> None:
    promtool = tool("promtool")
    text = (PROM / "alerts.yaml").read_text()
    # Invalid PromQL: check rules fails.
    (tmp_path / "alerts.yaml").write_text(text.replace("max by (provider) (lockstep_provider_up) == 0",
                                                       "max by (provider) (lockstep_provider_up ==", 1))
    r = run(promtool, "check", "rules", "alerts.yaml", cwd=tmp_path)
    assert r.returncode != 0 and "FAILED" in r.stdout + r.stderr
    # Valid PromQL that no longer pages when a job is stuck: the unit tests fail.
    (tmp_path / "alerts.yaml").write_text(text.replace('{state="placing"}) > 900', '{state="placing"}) > 9000'))
    (tmp_path / "alerts.test.yaml").write_text((PROM / "alerts.test.yaml").read_text())
    r = run(promtool, "test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert r.returncode != 0 and "LockstepJobsStuckPlacing" in r.stdout + r.stderr


def _dashboard_as_rules(dashboard: dict, path: Path) -> None:
    """The dashboard's queries as recording rules, so promtool parses each one."""
    exprs = [e.replace("$__rate_interval", "5m") for e in dashboard_exprs(dashboard)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]}]}))


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    promtool = tool("promtool")
    dashboard = json.loads(DASHBOARD.read_text())
    _dashboard_as_rules(dashboard, tmp_path / "ok.yaml")
    r = run(promtool, "check", "rules", "ok.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    dashboard["panels"][1]["targets"][0]["expr"] = "max by (state (lockstep_jobs)"
    _dashboard_as_rules(dashboard, tmp_path / "broken.yaml")
    assert run(promtool, "check", "rules", "broken.yaml", cwd=tmp_path).returncode != 0


# --------------------------------------------------------------------------- against a live scrape


def test_the_dashboard_shows_what_it_promises() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("jobs by state", "placements per provider", "burst rate", "spend", "provider errors",
                  "latency", "quote latency", "provider up", "circuit"):
        assert topic in titles, topic
    assert all(p.get("datasource", {}).get("uid") == "${datasource}" for p in dashboard["panels"] if p["type"] != "row")


def test_every_metric_the_dashboard_and_rules_use_is_exported(scrape: str) -> None:
    dashboard = dashboard_exprs(json.loads(DASHBOARD.read_text()))
    rules = rule_exprs(yaml.safe_load((PROM / "alerts.yaml").read_text()))
    assert len(used_metrics(dashboard)) >= 15 and len(used_metrics(rules)) >= 8
    assert not_exported(dashboard, scrape) == set()
    assert not_exported(rules, scrape) == set()


def test_a_metric_that_is_not_exported_fails_the_check(scrape: str) -> None:
    broken = json.loads(DASHBOARD.read_text())
    broken["panels"][1]["targets"][0]["expr"] = "max by (provider) (lockstep_provider_circuit_open)"
    assert not_exported(dashboard_exprs(broken), scrape) == {"lockstep_provider_circuit_open"}
    rules = yaml.safe_load((PROM / "alerts.yaml").read_text())
    rules["groups"][0]["rules"][0]["expr"] = "sum(lockstep_jobs_total) == 0"  # a gauge has no _total
    assert not_exported(rule_exprs(rules), scrape) == {"lockstep_jobs_total"}


# --------------------------------------------------------------------------- the new metrics are fed truthfully


def _samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


async def test_scrape_reads_spend_budgets_waiting_jobs_spikes_and_reconciliation(store) -> None:
    from datetime import UTC, datetime, timedelta

    from broker.api.metrics import ApiMetrics
    from broker.config import Settings
    from broker.models import Allocation, AllocationState, JobState, Tenant
    from broker.service import Lockstep
    from tests.store.helpers import job

    now = datetime.now(UTC)
    store.create_tenant(Tenant(name="acme", monthly_budget_usd=7300.0))
    store.create_job(job(tenant="acme", job_id="run", gpus=16))
    for s in (JobState.placing, JobState.provisioning, JobState.running):
        store.transition("run", s)
    store.add_allocation(Allocation(id="a-run", job_id="run", provider="aws", nodes=2, usd_per_hour=60.0,
                                    state=AllocationState.running, created_at=now - timedelta(hours=2)))
    store.create_job(job(tenant="acme", job_id="stuck", gpus=8, created=now - timedelta(minutes=20)))
    store.transition("stuck", JobState.placing)
    store.add_alert({"provider": "aws", "market": "spot", "sku": "p5.48xlarge", "region": "us-east-1",
                     "zone": "us-east-1a", "stat": "price", "gpu": "H100-SXM"}, now - timedelta(hours=1), 9.0, 4.5)
    svc = Lockstep(Settings(db_url=store.url), providers={}, store=store)
    metrics = ApiMetrics()
    at = now + timedelta(minutes=20)
    got = _samples(metrics.render(await svc.db(metrics.snapshot, svc, at)))
    month = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    billed_h = (at - max(now - timedelta(hours=2), month)).total_seconds() / 3600
    assert got[("lockstep_tenant_spend_usd", (("tenant", "acme"),))] == pytest.approx(60.0 * billed_h)
    assert got[("lockstep_tenant_burn_usd_per_hour", (("tenant", "acme"),))] == 60.0
    assert got[("lockstep_tenant_budget_usd", (("tenant", "acme"),))] == 7300.0
    assert 20 * 60 - 5 <= got[("lockstep_jobs_oldest_seconds", (("state", "placing"),))] <= 25 * 60
    assert got[("lockstep_jobs_oldest_seconds", (("state", "pending"),))] == 0
    assert got[("lockstep_price_spike_ratio", (("gpu", "H100-SXM"), ("provider", "aws")))] == 2.0
    assert got[("lockstep_price_spikes_open", (("gpu", "H100-SXM"), ("provider", "aws")))] == 1
    assert got[("lockstep_reconcile_last_completed_timestamp_seconds", ())] == 0  # no broker has run here

    # The router's placement hook and the broker's start-up reconciliation, as `serve` wires them.
    svc.placement_observer = metrics.placement_hook(None)
    await svc.broker.start()
    try:
        svc.broker.router.on_placed("aws", "placed")  # what a launch calls
        svc.broker.router.on_placed("aws", "capacity")
        got = _samples(metrics.render(await svc.db(metrics.snapshot, svc, at)))
    finally:
        await svc.broker.stop()
    assert got[("lockstep_placement_attempts_total", (("outcome", "placed"), ("provider", "aws")))] == 1
    assert got[("lockstep_placement_attempts_total", (("outcome", "capacity"), ("provider", "aws")))] == 1
    assert got[("lockstep_reconcile_unreachable_providers", ())] == 0
    assert abs(got[("lockstep_reconcile_last_completed_timestamp_seconds", ())] - now.timestamp()) < 300
