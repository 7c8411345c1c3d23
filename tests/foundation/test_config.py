"""One typed configuration: file, environment overrides, short aliases, secrets masked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.config import load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_validates() -> None:
    s = load_settings(ROOT / "deploy" / "lockstep.example.yaml")
    assert s.broker.max_queue_wait_hours == 4 and s.tracker.spike_multiple == 1.5


def test_env_overrides_file_and_aliases_enable_providers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("broker: {max_launch_tries: 2}\nvast: {min_reliability: 0.5}\n")
    monkeypatch.setenv("LOCKSTEP_BROKER__MAX_LAUNCH_TRIES", "7")
    monkeypatch.setenv("LOCKSTEP_VAST_API_KEY", "vk-secret-123")
    monkeypatch.setenv("LOCKSTEP_DB", str(tmp_path / "x.db"))
    s = load_settings(cfg)
    assert s.broker.max_launch_tries == 7
    assert s.vast.min_reliability == 0.5 and s.vast.enabled
    assert s.db_url == f"sqlite:///{tmp_path / 'x.db'}"
    dumped = json.dumps(s.masked()) + repr(s)
    assert "vk-secret-123" not in dumped
    assert s.vast.api_key.get_secret_value() == "vk-secret-123"


def test_owned_cost_is_amortised() -> None:
    owned = load_settings().slurm.owned
    # $300k over 4 years + $20k/year ops at 70% utilisation, plus 6 kW × 1.3 PUE × $0.12/kWh
    expected = (300_000 / (4 * 8766) + 20_000 / 8766) / 0.7 + 6 * 1.3 * 0.12
    assert owned.usd_per_node_hour() == pytest.approx(expected)
