"""All configuration in one typed model.

The core's sections are defined here; each market's section is its own, in ``providers/<market>/config.py``,
added to ``Settings`` under the key the registry gives it (:data:`providers.registry.SECTIONS`). Nothing here
names a market: the tables below are derived from the fields' declarations (``secret``, ``alias`` in
:mod:`broker.configbase`), so a market's settings, env aliases, secrets and credential live in its package.

Sources, later wins: defaults → a YAML file (``LOCKSTEP_CONFIG`` or
``--config``) → environment variables ``LOCKSTEP_<SECTION>__<FIELD>`` → the short aliases users reach for
(``LOCKSTEP_DB``, and those a market's fields declare; setting one of a market's also enables that market unless
the file or ``LOCKSTEP_<PROVIDER>__ENABLED`` says otherwise) → explicit overrides
(``--db``). pydantic-settings merges them (``Settings.settings_customise_sources``).

Mistakes are errors, never silently ignored: an unknown key (with a "did you mean"
for a near miss) or a value of the wrong type raises :class:`ConfigError`, one
readable line per problem naming the key path and where it was written (``FILE:LINE``
or the environment variable). ``check_config`` also reports what loads but cannot
work: a provider enabled without its credential, a database URL that does not parse,
a secret written inline in the file.

Secrets are ``SecretStr``: they print as ``**********`` in logs and reprs. Each has a
``*_file`` form (a mounted secret) and an environment variable.
``lockstep config show`` prints the effective configuration, where each value came
from, secrets masked.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from platformdirs import user_data_dir
from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from broker.configbase import (
    Attempts,
    Count,
    CountOrOff,
    MarketSection,
    Port,
    Rate,
    RuntimeConfig,  # a core section (callers import it from here); defined beside the base: providers read it
    Seconds,
    SecondsOrOff,
    Section,
    read_secret_file,
    secret,
    secret_http_url,
    secret_or_file,
)
from broker.errors import LockstepError, SpecError
from broker.logconfig import register_secrets
from broker.yamlload import duplicate_paths
from providers.registry import SECTIONS

_M = TypeVar("_M", bound=BaseModel)


def default_db_url() -> str:
    path = Path(user_data_dir("lockstep", appauthor=False)) / "lockstep.db"
    return f"sqlite:///{path}"


class BrokerConfig(Section):
    refresh_interval_s: Seconds = 60.0
    provider_timeout_s: Seconds = 30.0
    poll_interval_s: Seconds = 5.0
    place_interval_s: Seconds = 1.0
    max_launch_tries: Attempts = 5
    max_queue_wait_hours: float = Field(default=4.0, gt=0, le=8766)  # burst when on-prem wait exceeds this
    installation: str = "lockstep"
    # A provider whose calls (refresh, launch, poll) fail this many times in a row is not called until a
    # probe after circuit_backoff_s, doubled at each failed probe up to circuit_backoff_max_s.
    circuit_failures: int = Field(default=3, ge=1, le=1000)
    circuit_backoff_s: Seconds = 30.0
    circuit_backoff_max_s: Seconds = 1800.0
    # A job that cannot be placed fails, with every reason it collected, after this many launch rounds that
    # failed (0: no cap), or once it has waited placement_timeout_s since it was submitted or requeued
    # (0: no limit); a job with its own deadline waits until that deadline instead.
    placement_rounds: CountOrOff = 30
    placement_timeout_s: SecondsOrOff = 86400.0
    # The spot plan (docs/simulation.md): the time a (re)started job loses before it makes progress
    # again (boot, setup, restore its checkpoint), and how often a running on-demand job is offered a
    # move back to spot (0: never).
    restart_minutes: float = Field(default=10.0, ge=0, le=10_080)
    rebalance_interval_s: SecondsOrOff = 60.0
    # A running job stopped for its budget with signal_then_stop (a tenant's on_budget_exhausted) gets SIGTERM and
    # this long to checkpoint before its machines are released (docs/runtime.md); 0: released at once.
    budget_grace_s: SecondsOrOff = 120.0
    # A job whose every feasible option is a snapshot price (the bundled price snapshot's rows, or a live market's
    # offers priced from the snapshot): "warn" accepts it with a warning naming what to configure;
    # "refuse" refuses it (exit 3, HTTP 422) when no market that could run it is configured.
    snapshot_only_jobs: Literal["warn", "refuse"] = "warn"


class TrackerConfig(Section):
    interval_s: Seconds = 300.0
    spike_multiple: float = Field(default=1.5, gt=0, le=1000)  # flag when price > multiple × trailing median
    clear_multiple: float = Field(default=1.2, gt=0, le=1000)
    window: int = Field(default=12, ge=1, le=100_000)  # points in the trailing median
    retention_days: int = Field(default=90, ge=1, le=36_500)
    compact_after_days: int = Field(default=7, ge=0, le=36_500)
    # often carries a token: never printed
    webhook_url: Annotated[SecretStr | None, AfterValidator(secret_http_url)] = secret(
        "webhook_url_file", "LOCKSTEP_TRACKER__WEBHOOK_URL")
    webhook_url_file: str | None = None  # a mounted secret holding the URL; read when the settings load

    @model_validator(mode="after")
    def _url_from_file(self) -> TrackerConfig:
        self.webhook_url = secret_or_file(self.webhook_url, self.webhook_url_file, "webhook_url_file",
                                           "webhook_url (LOCKSTEP_TRACKER__WEBHOOK_URL)")
        if self.webhook_url_file:  # read from the file: checked as the inline form is
            try:
                secret_http_url(self.webhook_url)
            except ValueError as exc:
                raise ValueError(f"webhook_url_file: {exc}") from None
        return self


class HealthConfig(Section):
    """The health gates' limits: policies.health.HealthThresholds' defaults (tests/broker/test_settings_bounds.py
    holds them equal; configuration does not import policies)."""

    # below 70% of datasheet → unhealthy
    min_relative_tflops: float = Field(default=0.7, gt=0, le=10)
    max_allreduce_latency_us: dict[str, Annotated[float, Field(gt=0, le=1e9)]] = Field(
        default_factory=lambda: {"infiniband": 5.0, "efa": 30.0, "roce": 15.0, "ethernet": 200.0}
    )
    max_ecc_double_bit: int = Field(default=0, ge=0, le=1_000_000)
    # Where burn-in jobs leave their probe JSON for the broker to read: any directory on a single-host
    # cluster, a filesystem shared by the nodes and the broker on a real one. "" = <temp dir>/lockstep-burnin.
    burnin_results_dir: str = ""


class SecretsConfig(Section):
    """Where the names a job spec's ``secrets`` lists are looked up, at launch (docs/runtime.md).

    First match wins: a named file (``files``), a file of that name in ``dir`` (a mounted Kubernetes
    Secret or Docker secret), then the environment variable ``env_prefix`` + the name (``-`` and ``.``
    as ``_``, upper case).
    """

    files: dict[str, str] = Field(default_factory=dict)  # secret name → file holding its value
    dir: str | None = None  # a directory with one file per secret name
    env_prefix: str = "LOCKSTEP_SECRET_"


class ApiConfig(Section):
    host: str = "127.0.0.1"
    port: Port = 8080
    max_body_bytes: int = Field(default=1_048_576, ge=1, le=1 << 30)
    body_timeout_s: Seconds = 30.0  # a request body not received by then gets a 408
    rate_per_s: Rate = 50.0  # per tenant
    burst: Count = 100
    # Requests with unknown or revoked tokens, per client address (each costs a database lookup): over it → 429
    bad_token_rate_per_s: Rate = 1.0
    bad_token_burst: Count = 20
    # GET /openapi.json and /docs without a token (the document holds no secrets); false: a user or admin token
    public_docs: bool = True
    # A followed log (GET /v1/jobs/{id}/logs?follow=true) is ended after this long even if its job still runs:
    # no connection is held forever (a job that waits days to be placed, a client that forgot it)
    log_follow_max_s: Seconds = 86400.0


class LocalConfig(Section):
    """The per-user background broker of local mode (`lockstep server`, broker/cli/localbroker.py)."""

    # It exits once no job is unfinished and no command has asked anything for this long (0: never); the
    # next command that needs it starts it again.
    idle_exit_s: SecondsOrOff = 3600.0
    start_timeout_s: Seconds = 90.0  # a command waits this long for it to listen


def credential_files(section: object) -> tuple[tuple[str, tuple[int, ...] | None], ...]:
    """The identity of each file a configuration section reads a credential from (its ``*_file`` fields):
    it changes when such a file is replaced or rewritten (a rotated token), so a provider whose
    credentials were refused is tried again then, without a restart."""
    if not isinstance(section, BaseModel):
        return ()
    out: list[tuple[str, tuple[int, ...] | None]] = []
    for name in type(section).model_fields:
        path = getattr(section, name) if name.endswith("_file") else None
        if isinstance(path, str) and path:
            try:
                st = os.stat(os.path.expanduser(path))
                out.append((name, (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size)))
            except OSError:
                out.append((name, None))
    return tuple(out)


class EventsConfig(Section):
    """The event stream and webhooks (docs/api.md, "Events and webhooks")."""

    poll_interval_s: float = Field(default=0.5, gt=0, le=60)  # how often a follower / the outbox reads the store
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=120)
    webhook_max_attempts: int = Field(default=12, ge=1, le=100)  # then the delivery is failed (and listed so)
    webhook_backoff_initial_s: Seconds = 2.0
    webhook_backoff_max_s: Seconds = 900.0
    webhook_lease_s: Seconds = 60.0  # a sender that died mid-attempt: tried again after this
    # Webhook URLs must resolve to public addresses (no loopback, private, link-local or metadata ranges):
    # a tenant must not make the broker call into its own network. True only for tests and closed networks.
    webhook_allow_private: bool = False


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LOCKSTEP_", env_nested_delimiter="__", extra="forbid", case_sensitive=False,
        allow_inf_nan=False,
    )

    db_url: str = Field(default_factory=default_db_url,  # carries the password, if any
                        json_schema_extra={"lockstep_secret": {"file": "db_url_file", "env": "LOCKSTEP_DB",
                                                               "credential": False},
                                           "lockstep_alias": "LOCKSTEP_DB"})
    db_url_file: str | None = None  # a mounted secret holding the URL (it carries the password); read at load
    log_level: str = "INFO"
    # Each market's section, as the registry lists them (`<key>:` in the file, LOCKSTEP_<KEY>__<FIELD> in the
    # environment), here in the class body so that they keep their place among the keys (`config show`).
    __annotations__.update({key: Annotated[model, Field(default_factory=model)] for key, model in SECTIONS.items()})
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    tracker: TrackerConfig = Field(default_factory=TrackerConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)
    secrets: SecretsConfig = Field(default_factory=SecretsConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    events: EventsConfig = Field(default_factory=EventsConfig)
    local: LocalConfig = Field(default_factory=LocalConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Highest priority first. ``Settings(...)`` built in code reads its arguments and
        ``LOCKSTEP_<SECTION>__<FIELD>`` only; ``load_settings`` adds the file and the short aliases."""
        plan = _PLAN.get()
        if plan is None:
            return (init_settings, env_settings)
        file = (YamlConfigSettingsSource(settings_cls, yaml_file=plan),) if plan else ()
        return (init_settings, _AliasSource(settings_cls), env_settings, *file,
                _AliasSource(settings_cls, enables=True))

    @field_validator("db_url")
    @classmethod
    def _db_url(cls, v: str) -> str:
        """A plain path means an SQLite file."""
        v = v.strip()
        if "://" not in v:
            return f"sqlite:///{os.path.abspath(os.path.expanduser(v))}"
        reason = db_url_problem(v)  # refused as it loads, by every command: not an "internal error" later
        if reason:
            raise ValueError(reason)
        return v

    @model_validator(mode="after")
    def _db_url_from_file(self) -> Settings:
        inline = SecretStr(self.db_url) if "db_url" in self.model_fields_set else None
        url = secret_or_file(inline, self.db_url_file, "db_url_file", "db_url (LOCKSTEP_DB)")
        if url is not None and self.db_url_file:
            try:
                self.db_url = self._db_url(url.get_secret_value())
            except ValueError as exc:
                raise ValueError(f"db_url_file: {exc}") from None
        return self

    @model_validator(mode="after")
    def _markets_within_the_broker(self) -> Settings:
        for key in SECTIONS:  # what an enabled market's section says against the broker's (its own check)
            section = self.section(key, MarketSection)
            if section.enabled:
                try:
                    section.check_with_broker(self.broker.provider_timeout_s)
                except ValueError as exc:
                    raise ValueError(f"{key}: {exc}") from None
        return self

    def section(self, key: str, model: type[_M]) -> _M:
        """A market's section, typed (``settings.section("x", XConfig)``): the markets' sections are the registry's,
        so not declared here by name."""
        value = getattr(self, key)
        if not isinstance(value, model):
            raise TypeError(f"settings.{key} is a {type(value).__name__}, not {model.__name__}")
        return value

    def secret_values(self) -> list[str]:
        """The secrets this configuration holds in plain text, for the log redactor (every field marked secret)."""
        out = []
        for path in SECRETS:
            node: Any = self
            for key in path:
                node = getattr(node, key)
            if isinstance(node, SecretStr):
                out.append(node.get_secret_value())
        if _plain_sqlite(self.db_url):
            return out
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            password = make_url(self.db_url).password
        except (ArgumentError, ValueError):
            password = None
        return [*out, *([str(password)] if password else [])]

    def masked(self) -> dict[str, Any]:
        """The effective configuration as JSON-ready data, secrets masked (the database password too)."""
        data = self.model_dump(mode="json")
        data["db_url"] = mask_db_url(self.db_url)
        return data


def _plain_sqlite(url: str) -> bool:
    """A SQLite file or memory URL (no user, no password, nothing to check): told without importing
    SQLAlchemy, which a command that never opens the store (``lockstep quote``) should not pay for."""
    for prefix in ("sqlite://", "sqlite+pysqlite://"):
        if url.startswith(prefix):
            rest = url[len(prefix):]
            return rest == "" or (rest.startswith("/") and "?" not in rest)
    return False


def mask_db_url(url: str) -> str:
    """The URL with its password replaced by ``***``; an URL that does not parse is masked whole."""
    if _plain_sqlite(url):
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "**********"


# --------------------------------------------------------------------------- sources

def _marked(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """(key path, the field's json_schema_extra) of every field of the model and its sections that carries one."""
    for name, field in model.model_fields.items():
        path, ann = (*prefix, name), field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _marked(ann, path)
        elif isinstance(field.json_schema_extra, dict):
            yield path, field.json_schema_extra


def _derive() -> tuple[dict[str, tuple[str, ...]], dict[tuple[str, ...], tuple[str, str]],
                       dict[str, tuple[tuple[str, ...], ...]]]:
    aliases: dict[str, tuple[str, ...]] = {}
    secrets: dict[tuple[str, ...], tuple[str, str]] = {}
    credentials: dict[str, tuple[tuple[str, ...], ...]] = {}
    for path, extra in _marked(Settings):
        if isinstance(extra.get("lockstep_alias"), str):
            aliases[str(extra["lockstep_alias"])] = path
        mark = extra.get("lockstep_secret")
        if isinstance(mark, dict):
            file_key = (*path[:-1], str(mark["file"]))
            secrets[path] = (".".join(file_key), str(mark["env"]))
            if "__" not in str(mark["env"]):  # a short name (LOCKSTEP_<MARKET>_API_KEY), not the nested form
                aliases.setdefault(str(mark["env"]), path)
            if mark["credential"]:
                credentials[path[0]] = (*credentials.get(path[0], ()), path, file_key)
    return aliases, secrets, credentials


# Derived from the marks on the fields (``alias``, ``secret``), never kept by hand:
# ALIASES: short env var → key path (setting a section's one also enables it, unless the file or env says no);
# SECRETS: secret key path → (its *_file key, its env var), where it belongs instead of inline in the file;
# CREDENTIALS: section → keys any one of which is its credential.
ALIASES, SECRETS, CREDENTIALS = _derive()
# The sections a short alias enables (those with an ``enabled`` switch).
PROVIDERS = tuple(name for name, f in Settings.model_fields.items()
                  if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
                  and "enabled" in f.annotation.model_fields and any(p[0] == name for p in ALIASES.values()))
# While load_settings runs: the file it reads ("" for none). Unset: Settings(...) built in code.
_PLAN: ContextVar[str | None] = ContextVar("lockstep_config_file", default=None)


def _put(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        data = data.setdefault(key, {})
    data[path[-1]] = value


class _AliasSource(PydanticBaseSettingsSource):
    """The short environment names. With ``enables``: only ``enabled: true`` for each provider one
    of whose names is set; it has the lowest priority, so the file or ``LOCKSTEP_<P>__ENABLED`` wins."""

    def __init__(self, settings_cls: type[BaseSettings], *, enables: bool = False) -> None:
        super().__init__(settings_cls)
        self.enables = enables

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ builds the whole mapping

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for var, path in ALIASES.items():
            value = os.environ.get(var)
            if not value:
                continue
            if not self.enables:
                _put(out, path, value)
            elif path[0] in PROVIDERS:
                _put(out, (path[0], "enabled"), True)
        return out


# --------------------------------------------------------------------------- problems


@dataclass(frozen=True)
class Problem:
    """One mistake in the configuration: the key path, what is wrong, and where it was written."""

    key: str
    message: str
    where: str = ""  # "FILE:LINE", "FILE", or the environment variable

    def __str__(self) -> str:
        head = f"{self.where}: " if self.where else ""
        return f"{head}{self.key}: {self.message}" if self.key else f"{head}{self.message}"


class ConfigError(SpecError):
    """The configuration has mistakes: bad input (CLI exit 2), one line naming the first of them."""

    def __init__(self, problems: list[Problem], file: str | None = None, *, every_line: bool = False) -> None:
        self.problems = problems
        self.field, self.reason = problems[0].key, problems[0].message
        if every_line:  # what `lockstep config check` prints, line for line (`lockstep serve` refusing to start)
            LockstepError.__init__(self, "\n".join(str(p) for p in problems))
            return
        more = len(problems) - 1
        tail = f" (and {more} more: run `lockstep config check{' ' + file if file else ''}`)" if more else ""
        LockstepError.__init__(self, f"{problems[0]}{tail}")


@dataclass(frozen=True)
class _Layer:
    source: str  # "override", "env", "file"
    data: Mapping[str, Any]
    origins: Mapping[tuple[Any, ...], str]  # key path → "FILE:LINE" / env var name ({} = compute)

    def has(self, path: tuple[Any, ...]) -> bool:
        node: Any = self.data
        for key in path:
            if isinstance(node, Mapping) and key in node:
                node = node[key]
            elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
                node = node[key]
            else:
                return False
        return True

    def get(self, path: tuple[Any, ...]) -> Any:
        node: Any = self.data
        for key in path:
            node = node[key]
        return node

    def origin(self, path: tuple[Any, ...]) -> str:
        for n in range(len(path), -1, -1):  # the key itself, else the nearest enclosing one
            if path[:n] in self.origins:
                return self.origins[path[:n]]
        return ""


def _yaml_lines(node: yaml.Node, path: tuple[Any, ...], where: str, out: dict[tuple[Any, ...], str]) -> None:
    """Key path → "FILE:LINE" of the key (the line a person looks for)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value in node.value:
            key = (key_node.value,) if isinstance(key_node, yaml.ScalarNode) else ()
            if key:
                out[path + key] = f"{where}:{key_node.start_mark.line + 1}"
                _yaml_lines(value, path + key, where, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*path, i)] = f"{where}:{item.start_mark.line + 1}"
            _yaml_lines(item, (*path, i), where, out)


def _read_file(path: str) -> tuple[dict[str, Any], dict[tuple[Any, ...], str]]:
    """The file's mapping and its key lines; a file that cannot be read or is not a mapping is a problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([Problem("", f"cannot read the configuration file ({exc.strerror})", path)]) from None
    except UnicodeDecodeError:
        raise ConfigError([Problem("", "the configuration file is not UTF-8 text", path)]) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark else path
        raise ConfigError([Problem("", f"not valid YAML: {exc.problem or exc.context}", where)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem("", f"not valid YAML: {type(exc).__name__}", path)]) from None
    except RecursionError:
        raise ConfigError([Problem("", "not valid YAML: nested too deeply", path)]) from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError([Problem("", f"the top level must be a mapping of sections, not a {type(data).__name__}",
                                   f"{path}:1")])
    twice = duplicate_paths(node)
    if twice:  # PyYAML keeps the last of the two without a word: a whole market's section could vanish
        raise ConfigError([Problem(_dotted(key), f"written twice, at lines {first} and {again}", f"{path}:{again}")
                           for key, first, again in twice])
    lines: dict[tuple[Any, ...], str] = {}
    if node is not None:
        _yaml_lines(node, (), path, lines)
    return data, lines


def _env_name(path: tuple[Any, ...]) -> str:
    return "LOCKSTEP_" + "__".join(str(k) for k in path).upper()


class _Layers:
    """Every source's own data, highest priority first, to say where a value (or a mistake) came from."""

    def __init__(self, config_file: str | None, overrides: Mapping[str, Any]) -> None:
        self.file = config_file
        file_data, lines = _read_file(config_file) if config_file else ({}, {})
        alias_origins = {path: var for var, path in ALIASES.items() if os.environ.get(var)}
        enables = _AliasSource(Settings, enables=True)()
        enable_origins = {(path[0], "enabled"): var for path, var in alias_origins.items() if path[0] in enables}
        env = EnvSettingsSource(Settings)()
        self.layers = [
            _Layer("override", overrides, {}),
            _Layer("env", _AliasSource(Settings)(), alias_origins),
            _Layer("env", env, {}),
            _Layer("file", file_data, lines),
            _Layer("env", enables, enable_origins),
        ]

    def find(self, path: tuple[Any, ...]) -> tuple[str, str] | None:
        """(source, origin) of the value at ``path``, or None for a default."""
        for layer in self.layers:
            if layer.has(path):
                return layer.source, self._origin(layer, path)
        return None

    def value(self, path: tuple[Any, ...]) -> Any:
        for layer in self.layers:
            if layer.has(path):
                return layer.get(path)
        return None

    def locate(self, path: tuple[Any, ...]) -> tuple[str, str]:
        """Where a problem at ``path`` was written: the layer holding the longest part of the path."""
        for n in range(len(path), 0, -1):
            for layer in self.layers:
                if layer.has(path[:n]):
                    return layer.source, self._origin(layer, path[:n])
        return "", self.file or ""

    def _origin(self, layer: _Layer, path: tuple[Any, ...]) -> str:
        if layer.source == "env" and not layer.origins:
            return _env_name(path)
        if layer.source == "override":
            return "command line"
        return layer.origin(path)

    # ------------------------------------------------------------------ validation errors
    def problems(self, exc: ValidationError) -> list[Problem]:
        out: list[Problem] = []
        for err in exc.errors(include_url=False):
            loc = tuple(err["loc"])
            msg = str(err["msg"]).removeprefix("Value error, ")
            head, sep, rest = msg.partition(": ")
            model = _model_at(loc)
            if sep and model is not None and head in model.model_fields:  # "field: reason" from a validator
                loc, msg = (*loc, head), rest
            source, where = self.locate(loc)
            if err["type"] == "extra_forbidden":
                msg = self._unknown(loc, source)
            elif err["type"] != "missing" and not _is_secret(loc) and _scalar(err.get("input")):
                msg = f"{msg} (got {_short(err['input'])})"
            out.append(Problem(_dotted(loc), msg, where))
        return out

    @staticmethod
    def _unknown(loc: tuple[Any, ...], source: str) -> str:
        model = _model_at(loc[:-1])
        known = list(model.model_fields) if model is not None else []
        close = difflib.get_close_matches(str(loc[-1]).lower(), known, n=1, cutoff=0.6)
        if not close:
            return "unknown key" + (f" (known here: {', '.join(known)})" if known else "")
        hint = _env_name((*loc[:-1], close[0])) if source == "env" else close[0]
        return f"unknown key; did you mean '{hint}'?"

    # ------------------------------------------------------------------ what loads but cannot work
    def semantic(self) -> list[Problem]:
        out: list[Problem] = []
        for provider, keys in CREDENTIALS.items():
            enabled = self.value((provider, "enabled"))
            if not _truthy(enabled):
                continue
            present = [k for k in keys if self.value(k) not in (None, "")]
            if not present:
                secret, env = SECRETS[keys[0]]
                out.append(Problem(f"{provider}.enabled",
                                   f"{provider} is enabled but has no credential: set {secret} or {env}",
                                   self.locate((provider, "enabled"))[1]))
            for key in present:
                if key[-1].endswith("_file") and isinstance(self.value(key), str):
                    try:
                        read_secret_file(self.value(key))
                    except ValueError as exc:
                        out.append(Problem(_dotted(key), str(exc), self.locate(key)[1]))
        file_layer = self.layers[3]
        # A file checked where LOCKSTEP_DB (or --db) is set would pass on that value and fail where it runs
        # without it (a Kubernetes ConfigMap checked on a laptop): its own database URL is checked too (issue 29).
        winner = self.find(("db_url",))
        if file_layer.has(("db_url",)) and winner is not None and winner[0] != "file":
            own = file_layer.get(("db_url",))
            why = db_url_problem(own) if isinstance(own, str) and own else ""
            if why:
                out.append(Problem("db_url", f"{why} (the file's own value; {winner[1]} overrides it here only)",
                                   file_layer.origin(("db_url",))))
        for path, (ref, env) in SECRETS.items():
            if not file_layer.has(path) or file_layer.get(path) in (None, ""):
                continue
            if path == ("db_url",) and not _has_password(str(file_layer.get(path))):
                continue
            out.append(Problem(_dotted(path), f"a secret written inline in the file: put it in {ref} "
                                              f"(a mounted secret) or the environment ({env})",
                               file_layer.origin(path)))
        return out


def db_url_problem(url: str) -> str:
    """Why a database URL cannot be used, or "" (never repeats the URL: it may carry a password)."""
    if _plain_sqlite(url):
        return ""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return "cannot parse the database URL (expected sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)"
    backend = parsed.get_backend_name()
    if backend == "postgres":  # libpq's spelling, which SQLAlchemy does not take
        return "the scheme 'postgres://' is not SQLAlchemy's: write postgresql+psycopg://USER@HOST/DB"
    if backend not in ("sqlite", "postgresql"):
        return f"unsupported database {backend!r}: the store runs on SQLite or PostgreSQL"
    try:
        parsed.get_dialect()
    except NoSuchModuleError:
        return f"unknown database driver {parsed.drivername!r} (use postgresql+psycopg:// or sqlite:///)"
    if backend == "postgresql" and not parsed.database:
        return "the PostgreSQL URL names no database"
    return ""


def _has_password(url: str) -> bool:
    if _plain_sqlite(url):
        return False
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return bool(make_url(url).password)
    except (ArgumentError, ValueError):
        return "@" in url  # unparsable, but user:pass@host is the likely shape


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that holds the values at ``loc`` (list indexes and dict keys skipped)."""
    import typing

    model: type[BaseModel] | None = Settings
    for key in loc:
        if model is None:
            return None
        field = model.model_fields.get(str(key)) if not isinstance(key, int) else None
        if field is None:
            if isinstance(key, int):
                continue
            return None
        found: type[BaseModel] | None = None
        todo = [field.annotation]
        while todo:
            t = todo.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                found = t
                break
            todo.extend(typing.get_args(t))
        model = found
    return model


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(k) for k in loc)


def _is_secret(loc: tuple[Any, ...]) -> bool:
    return any(tuple(loc[: len(p)]) == p for p in SECRETS)


def _scalar(v: Any) -> bool:
    return isinstance(v, str | int | float | bool) or v is None


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _truthy(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on", "y", "t")
    return v is True or v == 1


# --------------------------------------------------------------------------- entry points


def _config_path(config_file: str | os.PathLike[str] | None) -> str | None:
    path = config_file or os.environ.get("LOCKSTEP_CONFIG")
    return os.fspath(path) if path else None


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build the settings from defaults, file, environment and explicit overrides.

    Raises :class:`ConfigError` (bad input) listing every unknown key and wrong value.
    """
    path = _config_path(config_file)
    token = _PLAN.set(path or "")
    try:
        layers = _Layers(path, overrides)
        settings = Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(layers.problems(exc), path) from None
    except SettingsError as exc:  # an environment value pydantic-settings could not parse (not JSON where it must be)
        raise ConfigError([_unparsable_env(exc)], path) from None
    finally:
        _PLAN.reset(token)
    register_secrets(settings.secret_values())  # masked in every log line from now on
    return settings


def _unparsable_env(exc: SettingsError) -> Problem:
    """The section and the variables of an environment value that could not be parsed."""
    m = re.search(r'field "(\w+)"', str(exc))
    section = m.group(1) if m else ""
    prefix = f"LOCKSTEP_{section.upper()}"
    names = sorted(v for v in os.environ if section and (v.upper() == prefix or v.upper().startswith(prefix + "__")))
    return Problem(section, "cannot parse its value from the environment: a mapping or a list is written as JSON "
                   '(e.g. \'{"key": 1}\')', ", ".join(names) or "environment")


def check_config(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> list[Problem]:
    """Every problem of the configuration as it would load here (file + environment), at once."""
    return _checked(config_file, overrides)[0]


def _checked(config_file: str | os.PathLike[str] | None,
             overrides: Mapping[str, Any]) -> tuple[list[Problem], Settings | None]:
    """The problems, and the settings when they loaded (what a server would run on)."""
    path = _config_path(config_file)
    try:
        layers = _Layers(path, overrides)
    except ConfigError as exc:
        return exc.problems, None
    except SettingsError as exc:
        return [_unparsable_env(exc)], None
    problems: list[Problem] = []
    settings: Settings | None = None
    try:
        settings = load_settings(path, **overrides)
    except ConfigError as exc:
        problems.extend(exc.problems)
    problems += layers.semantic()

    def in_file_order(p: Problem) -> tuple[int, int, str]:
        head, _, line = p.where.rpartition(":")
        return (0, int(line), "") if path and head == path and line.isdigit() else (1, 0, p.where)

    return sorted(dict.fromkeys(problems), key=in_file_order), settings  # a file both checks read is said once


def sound_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """The settings a server runs on: refused, with every line ``lockstep config check`` prints, on anything
    that check refuses (one validation path: an inline secret, a provider enabled without its credential, ...)."""
    problems, settings = _checked(config_file, overrides)
    if problems or settings is None:
        raise ConfigError(problems or [Problem("", "the configuration did not load")], _config_path(config_file),
                          every_line=True)
    return settings


@dataclass(frozen=True)
class Entry:
    """One effective setting for `lockstep config show`."""

    key: str
    value: Any  # JSON-ready, secrets masked
    source: str  # "default", "file", "env", "override"
    origin: str  # "FILE:LINE", the environment variable, or ""


def effective(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Iterator[Entry]:
    """Each leaf setting with its masked value and where it came from."""
    path = _config_path(config_file)
    layers = _Layers(path, overrides)
    settings = load_settings(path, **overrides)
    data = settings.masked()
    from_file = {path: tuple(ref.split(".")) for path, (ref, _) in SECRETS.items()}  # a secret read from its file

    def walk(model: type[BaseModel], node: Mapping[str, Any], prefix: tuple[str, ...]) -> Iterator[Entry]:
        for name, field in model.model_fields.items():
            path, sub = (*prefix, name), field.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):  # a section: its fields are the leaves
                yield from walk(sub, node[name], path)
                continue
            found = layers.find(path) or (layers.find(from_file[path]) if path in from_file else None)
            source, origin = found if found else ("default", "")
            yield Entry(_dotted(path), node.get(name), source, origin)

    yield from walk(Settings, data, ())
