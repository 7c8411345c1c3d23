"""The tracker's Kubernetes manifests: they parse, agree with each other, carry a valid configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from broker.config import check_config, load_settings
from tests.conftest import ROOT

K8S = ROOT / "deploy" / "k8s"


def docs(name: str) -> dict[str, dict]:
    """The documents of a manifest under deploy/k8s/base (or deploy/k8s), by kind."""
    path = K8S / "base" / name if (K8S / "base" / name).exists() else K8S / name
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}


def test_cronjob_runs_one_tracker_pass_and_never_overlaps() -> None:
    cron = docs("tracker-cronjob.yaml")["CronJob"]
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:4] == ["lockstep", "prices", "track", "--once"]
    assert pod["restartPolicy"] == "Never" and pod["serviceAccountName"] == "lockstep-tracker"


def test_every_config_and_secret_reference_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pod = docs("tracker-cronjob.yaml")["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    secret = docs("lockstep-secrets.example.yaml")["Secret"]
    config_map = docs("lockstep-config.yaml")["ConfigMap"]
    for e in env.values():
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    assert pod["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    mount = pod["containers"][0]["volumeMounts"][0]["mountPath"]
    (key,) = config_map["data"]
    assert env["LOCKSTEP_CONFIG"]["value"] == f"{mount}/{key}"
    # The ConfigMap's file is a valid Lockstep configuration.
    cfg = tmp_path / key
    cfg.write_text(config_map["data"][key])
    s = load_settings(cfg)
    assert s.aws.enabled and s.vast.enabled and not s.catalog.enabled
    # ... with no mistake `lockstep config check` finds, given the credential the Secret provides.
    monkeypatch.setenv("LOCKSTEP_VAST_API_KEY", "from-the-secret")
    assert check_config(cfg) == []
    assert (s.tracker.spike_multiple, s.tracker.clear_multiple, s.tracker.interval_s) == (1.5, 1.2, 300.0)
