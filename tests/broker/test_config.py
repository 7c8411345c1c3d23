"""One typed configuration: file, environment overrides, short aliases, secrets masked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import ConfigError, Settings, check_config, load_settings

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


# --------------------------------------------------------------------------- mistakes are errors


def _lockstep(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A real `lockstep` process (this checkout's code) with a clean LOCKSTEP_* environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=120,
                          env={**clean, **(env or {})}, cwd=ROOT)


def test_unknown_key_is_an_error_with_a_near_miss_and_its_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("vast:\n  min_reliability: 0.5\n  enabeld: true\n")
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert str(err.value) == f"{cfg}:3: vast.enabeld: unknown key; did you mean 'enabled'?"
    # A section name far from any known one: no guess, the known keys instead.
    cfg.write_text("scheduler: {}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:1: scheduler: unknown key \(known here: db_url,"):
        load_settings(cfg)


def test_wrong_type_names_the_key_path_in_the_file_and_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("aws:\n  reserved_pools:\n    - {name: p, sku: p4d.24xlarge, region: r, zone: z, count: many}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert str(err.value).startswith(f"{cfg}:3: aws.reserved_pools.0.count: Input should be a valid integer")
    assert "(got 'many')" in str(err.value)
    monkeypatch.setenv("LOCKSTEP_BROKER__POLL_INTERVAL_S", "soon")
    monkeypatch.setenv("LOCKSTEP_SLURM__ENABELD", "1")
    problems = check_config(None)
    assert [str(p).split(": ")[:2] for p in problems] == [
        ["LOCKSTEP_BROKER__POLL_INTERVAL_S", "broker.poll_interval_s"],
        ["LOCKSTEP_SLURM__ENABELD", "slurm.enabeld"],
    ]
    assert "did you mean 'LOCKSTEP_SLURM__ENABLED'?" in str(problems[1])


def test_an_environment_value_that_is_not_json_where_json_is_needed_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCKSTEP_HEALTH__MAX_ALLREDUCE_LATENCY_US", "notjson")
    with pytest.raises(ConfigError) as err:
        load_settings(None)
    assert str(err.value).startswith("LOCKSTEP_HEALTH__MAX_ALLREDUCE_LATENCY_US: health: cannot parse its value")
    assert [p.where for p in check_config(None)] == ["LOCKSTEP_HEALTH__MAX_ALLREDUCE_LATENCY_US"]
    out = subprocess.run([sys.executable, "-m", "broker", "quote", "examples/finetune-1gpu.yaml", "--json"],
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2],
                         env={**os.environ, "LOCKSTEP_DB": str(tmp_path / "x.db")})
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "lockstep: LOCKSTEP_HEALTH__MAX_ALLREDUCE_LATENCY_US: health: cannot parse its value from the environment: "
        "a mapping or a list is written as JSON (e.g. '{\"key\": 1}')"]


def test_a_secret_of_the_wrong_type_is_named_but_never_shown(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("vast:\n  api_key: [s3cr3t-key-value]\n  api_kye: s3cr3t-typo-value\n")
    problems = check_config(cfg)
    text = "\n".join(map(str, problems))
    assert "vast.api_key:" in text and "vast.api_kye: unknown key; did you mean 'api_key'?" in text
    assert "s3cr3t" not in text


FIVE_MISTAKES = """\
slurm:
  enabled: true
  token: eyJhbGciOiJIUzI1NiJ9.e30.inline-secret
vast:
  enabeld: true
broker:
  max_launch_tries: five
db_url: "postgres://lockstep:pw@db:5432/lockstep"
"""


def test_config_check_reports_five_mistakes_on_five_lines_and_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "five.yaml"
    cfg.write_text(FIVE_MISTAKES)
    r = _lockstep("config", "check", str(cfg))
    assert r.returncode == 2, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [line.split(": ")[:2] for line in lines] == [
        [f"{cfg}:3", "slurm.token"],          # a secret written inline
        [f"{cfg}:5", "vast.enabeld"],         # an unknown key (near miss)
        [f"{cfg}:7", "broker.max_launch_tries"],  # a wrong type
        [f"{cfg}:8", "db_url"],               # a URL the store cannot use
        [f"{cfg}:8", "db_url"],               # ... with its password inline
    ], r.stdout
    assert "pw" not in r.stdout.replace("password", "") and "inline-secret" not in r.stdout
    assert "did you mean 'enabled'" in lines[1] and "(got 'five')" in lines[2]
    assert "write postgresql+psycopg://" in lines[3]

    # Credentials: slurm enabled with neither token nor token_file, once the inline token is gone.
    cfg.write_text("slurm:\n  enabled: true\nvast: {enabled: true, api_key_file: /nonexistent/key}\n")
    r = _lockstep("config", "check", "--json", str(cfg))
    assert r.returncode == 2
    assert [(p["where"], p["key"]) for p in json.loads(r.stdout)] == [
        (f"{cfg}:2", "slurm.enabled"), (f"{cfg}:3", "vast.api_key_file")]
    # The same file with the credential from the environment, as a Kubernetes Secret gives it.
    cfg.write_text("slurm:\n  enabled: true\n")
    ok = _lockstep("config", "check", str(cfg), env={"LOCKSTEP_SLURM_TOKEN": "eyJ.e30.x"})
    assert ok.returncode == 0 and ok.stdout.strip() == f"{cfg}: ok"


def test_unknown_key_in_lockstep_config_stops_serve_with_that_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("api:\n  port: 8080\n  hots: 0.0.0.0\n")
    r = _lockstep("serve", "--port", "0", env={"LOCKSTEP_CONFIG": str(cfg)})
    assert r.returncode == 2
    assert r.stderr.strip() == f"lockstep: {cfg}:3: api.hots: unknown key; did you mean 'host'?"
    assert r.stdout == ""
    # Any command, not only serve; a file that is not YAML, or is missing, is one line too.
    cfg.write_text("api: [unclosed\n")
    r = _lockstep("--config", str(cfg), "offers")
    assert r.returncode == 2 and r.stderr.startswith(f"lockstep: {cfg}:2: not valid YAML")
    r = _lockstep("--config", str(tmp_path / "missing.yaml"), "offers")
    assert r.returncode == 2 and "cannot read the configuration file" in r.stderr


def test_config_show_says_where_each_value_came_from_secrets_masked(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("broker:\n  max_launch_tries: 2\nvast:\n  min_reliability: 0.5\n")
    env = {"LOCKSTEP_VAST_API_KEY": "vk-shown-nowhere-42", "LOCKSTEP_BROKER__POLL_INTERVAL_S": "7",
           "LOCKSTEP_DB": "postgresql+psycopg://lockstep:pg-pass-77@db:5432/lockstep"}
    r = _lockstep("--config", str(cfg), "config", "show", "--json", env=env)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["broker.max_launch_tries"] == {"value": 2, "source": "file", "origin": f"{cfg}:2"}
    assert shown["broker.poll_interval_s"] == {"value": 7.0, "source": "env",
                                               "origin": "LOCKSTEP_BROKER__POLL_INTERVAL_S"}
    assert shown["broker.place_interval_s"] == {"value": 1.0, "source": "default", "origin": ""}
    assert shown["vast.enabled"] == {"value": True, "source": "env", "origin": "LOCKSTEP_VAST_API_KEY"}
    assert shown["vast.api_key"]["value"] == "**********"
    assert shown["db_url"]["value"] == "postgresql+psycopg://lockstep:***@db:5432/lockstep"
    text = _lockstep("--config", str(cfg), "config", "show", env=env)
    assert text.returncode == 0
    assert re.search(rf"^broker\.max_launch_tries +2 +\(file {re.escape(str(cfg))}:2\)$", text.stdout, re.M)
    for out in (r.stdout, text.stdout):
        assert "vk-shown-nowhere-42" not in out and "pg-pass-77" not in out


def test_secrets_from_files_and_the_alias_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key, hook, db = tmp_path / "vast-key", tmp_path / "hook", tmp_path / "db-url"
    key.write_text("vk-from-a-file\n")
    hook.write_text("https://hooks.example.com/T0/secret\n")
    db.write_text(f"sqlite:///{tmp_path / 'from-file.db'}\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"db_url_file: {db}\nvast: {{enabled: true, api_key_file: {key}}}\n"
                   f"tracker: {{webhook_url_file: {hook}}}\nslurm: {{enabled: false}}\n")
    s = load_settings(cfg)
    assert s.vast.api_key is not None and s.vast.api_key.get_secret_value() == "vk-from-a-file"
    assert s.tracker.webhook_url is not None and s.tracker.webhook_url.get_secret_value().endswith("/secret")
    assert s.db_url == f"sqlite:///{tmp_path / 'from-file.db'}"
    assert check_config(cfg) == []
    # A short alias enables its provider unless the file (or LOCKSTEP_<P>__ENABLED) says otherwise.
    monkeypatch.setenv("LOCKSTEP_SLURM_URL", "http://127.0.0.1:1")
    assert not load_settings(cfg).slurm.enabled
    monkeypatch.setenv("LOCKSTEP_SLURM__ENABLED", "true")
    assert load_settings(cfg).slurm.enabled and load_settings(cfg).slurm.url == "http://127.0.0.1:1"
    # Both forms of one secret: an error naming both, never the value.
    monkeypatch.setenv("LOCKSTEP_VAST_API_KEY", "vk-from-env-1")
    both = r"vast.api_key_file: set api_key \(LOCKSTEP_VAST_API_KEY\) or api_key_file, not both"
    with pytest.raises(ConfigError, match=both) as err:
        load_settings(cfg)
    assert "vk-from" not in str(err.value)
    monkeypatch.delenv("LOCKSTEP_VAST_API_KEY")
    key.write_text("")
    with pytest.raises(ConfigError, match=rf"{cfg}:2: vast.api_key_file: '{key}' is empty"):
        load_settings(cfg)


def test_settings_built_in_code_read_neither_the_file_nor_the_aliases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("broker: {max_launch_tries: 2}\n")
    monkeypatch.setenv("LOCKSTEP_CONFIG", str(cfg))
    monkeypatch.setenv("LOCKSTEP_VAST_API_KEY", "vk-x-123456")
    s = Settings(db_url="sqlite:///x.db")
    assert s.broker.max_launch_tries == 5 and not s.vast.enabled and s.vast.api_key is None
    assert load_settings().broker.max_launch_tries == 2 and load_settings().vast.enabled
