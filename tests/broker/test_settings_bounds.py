"""Settings that cannot be wrong (issue 23): every numeric setting is bounded, a URL that cannot work is refused
with its key, `serve` refuses exactly what `config check` refuses (same lines), and a key written twice in a
configuration or a job spec is an error naming both lines."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import annotated_types
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from broker.config import ConfigError, Settings, check_config, sound_settings
from broker.errors import SpecError
from broker.specs import parse_spec_text

ROOT = Path(__file__).resolve().parents[2]


def _numeric_leaves(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(key path, field) of every int/float setting, nested sections and dict values (key "x") included."""
    out: list[tuple[tuple[str, ...], Any]] = []
    for name, field in model.model_fields.items():
        path, ann = (*prefix, name), field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _numeric_leaves(ann, path)
            continue
        kinds = [ann, *typing.get_args(ann)]
        if ann in (int, float) or (float in kinds and bool not in kinds) or (int in kinds and bool not in kinds):
            out.append((path, field))
        elif typing.get_origin(ann) is dict:
            value = typing.get_args(ann)[1]
            if typing.get_origin(value) is typing.Annotated and typing.get_args(value)[0] in (int, float):
                out.append(((*path, "x"), typing.get_args(value)[1]))
            elif value in (int, float):
                out.append(((*path, "x"), None))
    return out


LEAVES = _numeric_leaves(Settings)
# The settings where 0 is a working value ("off", "no cap", "free"); every other one refuses 0.
ZERO_MEANS_SOMETHING = {
    "broker.placement_rounds", "broker.placement_timeout_s", "broker.restart_minutes",
    "broker.rebalance_interval_s", "runtime.grace_s", "aws.egress_usd_per_gb", "vast.egress_usd_per_gb",
    "vast.min_inet_down_mbps", "vast.min_reliability", "slurm.owned.capex_usd", "slurm.owned.ops_usd_per_year",
    "slurm.owned.power_kw", "slurm.owned.usd_per_kwh", "tracker.compact_after_days", "health.max_ecc_double_bit",
    "vast.list_reuse_s", "broker.budget_grace_s", "local.idle_exit_s",
    "slurm.keep_failed_workdirs_h",  # 0: a failed attempt's work folder is not kept
}


def _bounds(field: Any) -> tuple[float, float, bool, bool]:
    """(low, high, low is exclusive, high is exclusive) from the field's declared constraints."""
    low, high, low_open, high_open = -math.inf, math.inf, False, False
    for m in getattr(field, "metadata", []) or []:
        if isinstance(m, annotated_types.Gt):
            low, low_open = float(m.gt), True  # type: ignore[arg-type]
        elif isinstance(m, annotated_types.Ge):
            low = float(m.ge)  # type: ignore[arg-type]
        elif isinstance(m, annotated_types.Lt):
            high, high_open = float(m.lt), True  # type: ignore[arg-type]
        elif isinstance(m, annotated_types.Le):
            high = float(m.le)  # type: ignore[arg-type]
    return low, high, low_open, high_open


def _is_int(field: Any) -> bool:
    ann = getattr(field, "annotation", None)
    return ann is int or int in typing.get_args(ann)


def test_every_numeric_setting_declares_finite_bounds() -> None:
    assert len(LEAVES) > 60  # the walk found them (sections, nested owned cost, dict values)
    unbounded = [".".join(p) for p, f in LEAVES if not all(map(math.isfinite, _bounds(f)[:2]))]
    assert not unbounded, f"numeric settings without a lower and an upper bound: {unbounded}"
    for path, field in LEAVES:
        low, _, low_open, _ = _bounds(field)
        zero_ok = low < 0 or (low == 0 and not low_open)
        key = ".".join(path)
        assert zero_ok == (key in ZERO_MEANS_SOMETHING), f"{key}: 0 is {'' if zero_ok else 'not '}accepted"
        assert low >= 0, f"{'.'.join(path)} accepts negative values"


def _nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return out


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}


BAD = st.one_of(st.just(math.nan), st.just(math.inf), st.just(-math.inf), st.floats(max_value=-1e-6),
                st.just(0), st.floats(min_value=1e10, max_value=1e300), st.integers(max_value=-1),
                st.integers(min_value=10**10, max_value=10**30))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(leaf=st.sampled_from(LEAVES), value=BAD)
def test_a_bad_number_in_any_setting_is_refused_naming_its_key(leaf: tuple[tuple[str, ...], Any], value: float,
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Non-finite, negative, zero and huge → one problem naming the key, from the check `lockstep config check`
    runs and from the one `lockstep serve` runs (the same lines)."""
    path, field = leaf
    key = ".".join(path)
    if value == 0 and key in ZERO_MEANS_SOMETHING:
        value = -1
    if _is_int(field) and isinstance(value, float) and math.isfinite(value):
        value = int(value) if abs(value) >= 1 else -1
    for var in [v for v in os.environ if v.startswith("LOCKSTEP_")]:
        monkeypatch.delenv(var)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_nest(path, value)))
    problems = check_config(cfg)
    assert [p.key for p in problems] == [key], (value, problems)
    assert problems[0].where == f"{cfg}:{len(path)}"
    with pytest.raises(ConfigError) as err:
        sound_settings(cfg)
    assert str(err.value) == "\n".join(str(p) for p in problems)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(leaf=st.sampled_from(LEAVES), data=st.data())
def test_a_number_inside_its_bounds_is_accepted(leaf: tuple[tuple[str, ...], Any], data: st.DataObject,
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, field = leaf
    low, high, low_open, high_open = _bounds(field)
    if _is_int(field):
        value: float = data.draw(st.integers(min_value=int(low) + (1 if low_open else 0),
                                             max_value=int(high) - (1 if high_open else 0)))
    else:
        value = data.draw(st.floats(min_value=low, max_value=high, exclude_min=low_open, exclude_max=high_open))
    for var in [v for v in os.environ if v.startswith("LOCKSTEP_")]:
        monkeypatch.delenv(var)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_nest(path, value)))
    # A minimum above a maximum elsewhere is no concern of this test: only this key must be quiet.
    assert [p for p in check_config(cfg) if p.key == ".".join(path)] == []


def test_a_bad_number_in_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("LOCKSTEP_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("LOCKSTEP_BROKER__POLL_INTERVAL_S", "nan")
    monkeypatch.setenv("LOCKSTEP_API__PORT", "70000")
    problems = check_config(None)
    assert [(p.key, p.where) for p in problems] == [("api.port", "LOCKSTEP_API__PORT"),
                                                     ("broker.poll_interval_s", "LOCKSTEP_BROKER__POLL_INTERVAL_S")]


@pytest.mark.parametrize(("text", "key"), [
    ("db_url: postgres://\n", "db_url"),
    ("db_url: 'mysql://u@h/db'\n", "db_url"),
    ("vast:\n  url: 'console.vast.ai'\n", "vast.url"),
    ("slurm:\n  url: 'http://h:99999'\n", "slurm.url"),
    ("aws:\n  endpoint_url: 'ftp://moto'\n", "aws.endpoint_url"),
])
def test_a_url_that_cannot_work_is_refused_with_its_key(tmp_path: Path, text: str, key: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("LOCKSTEP_")]:
        monkeypatch.delenv(var)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    assert [p.key for p in check_config(cfg)] == [key]


def test_a_webhook_url_read_from_its_file_is_checked_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("LOCKSTEP_")]:
        monkeypatch.delenv(var)
    hook = tmp_path / "hook"
    hook.write_text("hooks.example/s3cret\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"tracker:\n  webhook_url_file: {hook}\n")
    problems = check_config(cfg)
    assert [p.key for p in problems] == ["tracker.webhook_url_file"] and "s3cret" not in str(problems[0])


def _lockstep(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=120,
                          env={**_clean_env(), **(env or {})}, cwd=ROOT)


def test_serve_refuses_what_config_check_refuses_with_the_same_lines(tmp_path: Path) -> None:
    """The issue's operator session: NaN poll interval, port 99999, libpq's URL scheme, an inline secret, a
    provider enabled without its credential. Each is exit 2 naming its key, never "internal error"; serve
    prints the lines config check prints, and never starts."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("broker:\n  poll_interval_s: .nan\napi:\n  port: 99999\ndb_url: postgres://\n"
                   "vast:\n  enabled: true\n  api_key: vk-inline-1\nslurm:\n  enabled: true\n")
    check = _lockstep("config", "check", str(cfg))
    serve = _lockstep("--config", str(cfg), "serve", "--port", "0")
    assert check.returncode == serve.returncode == 2
    lines = check.stdout.strip().splitlines()
    assert [ln.split(": ")[1] for ln in lines] == ["broker.poll_interval_s", "api.port", "db_url", "vast.api_key",
                                                    "slurm.enabled"]
    assert serve.stderr.strip().splitlines() == ["lockstep: " + lines[0], *lines[1:]]
    assert "internal error" not in serve.stderr and serve.stdout == ""
    assert "vk-inline-1" not in check.stdout + serve.stderr


@pytest.mark.parametrize("secret", ["slurm:\n  token: eyJ.e30.inline\n", "vast:\n  api_key: vk-inline-2\n",
                                    "tracker:\n  webhook_url: 'https://hooks.example/t0ken'\n"])
def test_serve_refuses_an_inline_secret(tmp_path: Path, secret: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(secret)
    r = _lockstep("--config", str(cfg), "--db", str(tmp_path / "s.db"), "serve", "--port", "0")
    assert r.returncode == 2
    assert "a secret written inline in the file" in r.stderr and r.stdout == ""
    assert "inline-" not in r.stderr and "t0ken" not in r.stderr


def test_a_config_with_a_section_twice_names_both_lines(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("vast:\n  min_reliability: 0.5\nbroker:\n  poll_interval_s: 2\n  poll_interval_s: 3\n"
                   "vast:\n  verified_only: false\n")
    problems = check_config(cfg)
    assert [str(p) for p in problems] == [f"{cfg}:5: broker.poll_interval_s: written twice, at lines 4 and 5",
                                          f"{cfg}:6: vast: written twice, at lines 1 and 6"]
    r = _lockstep("--config", str(cfg), "offers")
    assert r.returncode == 2 and "written twice, at lines 4 and 5" in r.stderr


def test_a_job_spec_with_a_field_twice_names_both_lines(tmp_path: Path) -> None:
    text = "name: x\ngpus: 1\ncommand: echo hi\ngpus: 2\n"
    with pytest.raises(SpecError) as err:
        parse_spec_text(text, source="job.yaml")
    assert err.value.field == "gpus" and "lines 2 and 4" in err.value.reason
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    r = _lockstep("--db", str(tmp_path / "s.db"), "quote", str(spec))
    assert r.returncode == 2 and "gpus" in r.stderr and "lines 2 and 4" in r.stderr


def test_secret_alias_and_credential_tables_are_derived_from_the_fields() -> None:
    """Declared on the fields, derived in one place: a secret added to a section is masked, refused inline and
    read from its file without a second list to keep (the hand-kept list had drifted: it lacked slurm.token)."""
    from broker.config import ALIASES, CREDENTIALS, PROVIDERS, SECRETS

    assert SECRETS == {("db_url",): ("db_url_file", "LOCKSTEP_DB"),
                       ("slurm", "token"): ("slurm.token_file", "LOCKSTEP_SLURM_TOKEN"),
                       ("vast", "api_key"): ("vast.api_key_file", "LOCKSTEP_VAST_API_KEY"),
                       ("tracker", "webhook_url"): ("tracker.webhook_url_file", "LOCKSTEP_TRACKER__WEBHOOK_URL")}
    assert CREDENTIALS == {"slurm": (("slurm", "token"), ("slurm", "token_file")),
                           "vast": (("vast", "api_key"), ("vast", "api_key_file"))}
    assert ALIASES["LOCKSTEP_SLURM_TOKEN"] == ("slurm", "token") and ALIASES["LOCKSTEP_VAST_URL"] == ("vast", "url")
    assert set(PROVIDERS) == {"slurm", "aws", "vast"}


def test_config_show_says_a_token_read_from_its_file_came_from_that_file(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.config import effective

    for var in [v for v in os.environ if v.startswith("LOCKSTEP_")]:
        monkeypatch.delenv(var)
    token = tmp_path / "token"
    token.write_text("eyJ.e30.from-file\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"slurm:\n  enabled: true\n  token_file: {token}\n")
    entry = {e.key: e for e in effective(cfg)}["slurm.token"]
    assert (entry.source, entry.origin) == ("file", f"{cfg}:3") and "from-file" not in str(entry.value)


def test_health_defaults_are_the_policys() -> None:
    from broker.config import HealthConfig
    from policies.health import HealthThresholds

    assert HealthThresholds.of(HealthConfig()) == HealthThresholds()
