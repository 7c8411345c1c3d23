"""What every configuration section is built from, the core's and each market's (``providers/<market>/config.py``).

A small module of its own, importing nothing of the project: :mod:`broker.config` assembles ``Settings`` from the
core's sections and the markets' the registry lists (:mod:`providers.registry`), so a market's settings cannot
import :mod:`broker.config` (that would be an import cycle). Here: the bounded number types, URLs that can work,
the marks that declare a secret (``secret``) or a short environment name (``alias``) on its field, reading a
secret from its ``*_file``, the section base classes, and the in-job wrapper's settings every market reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr


def read_secret_file(path: str) -> SecretStr:
    """A secret from a mounted file (trailing newline dropped); errors never carry its bytes."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"cannot read {path!r} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path!r} is not UTF-8 text") from None
    if not text:
        raise ValueError(f"{path!r} is empty")
    return SecretStr(text)


def secret_or_file(inline: SecretStr | None, path: str | None, field: str, inline_name: str) -> SecretStr | None:
    """A secret given inline, or read from the file its ``*_file`` field names; both is a mistake."""
    if not path:
        return inline
    if inline is not None:
        raise ValueError(f"{field}: set {inline_name} or {field}, not both")
    try:
        return read_secret_file(path)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None


# Every number a setting holds is bounded: finite (``allow_inf_nan=False`` on every section), positive where it
# is an interval, a timeout or a limit, and below a maximum no working configuration reaches, so that a typo
# (``poll_interval_s: -5``, ``.nan``, ``1e300``) is an error naming the key, not a broker that polls 157 times a
# second or never again.
DAY = 86_400.0
Seconds = Annotated[float, Field(gt=0, le=30 * DAY)]  # an interval or a timeout: > 0
SecondsOrOff = Annotated[float, Field(ge=0, le=365 * DAY)]  # 0 = off / no limit
Attempts = Annotated[int, Field(ge=1, le=100)]
Count = Annotated[int, Field(ge=1, le=1_000_000)]  # a limit, a size, a batch: at least 1
CountOrOff = Annotated[int, Field(ge=0, le=1_000_000)]  # 0 = no cap
Usd = Annotated[float, Field(ge=0, le=1e9)]
Rate = Annotated[float, Field(gt=0, le=1e6)]  # per second
Fraction = Annotated[float, Field(ge=0, le=1)]
Port = Annotated[int, Field(ge=1, le=65_535)]


def http_url(value: str | None) -> str | None:
    """An http(s) URL with a host (and a port in range), or an error that never repeats the URL (a webhook's
    may carry a token)."""
    if value is None:
        return None
    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        raise ValueError("not a URL that can work (a port out of 1-65535, or a malformed address)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not a URL that can work: expected http://HOST[:PORT]/... or https://...")
    return value.strip()


HttpUrl = Annotated[str, AfterValidator(http_url)]


def secret_http_url(value: SecretStr | None) -> SecretStr | None:
    if value is not None:
        http_url(value.get_secret_value())
    return value


def secret(file: str, env: str, *, credential: bool = False, **kw: Any) -> Any:
    """A secret setting, declared where it is defined: ``file`` is the sibling ``*_file`` key that reads it from a
    mounted secret, ``env`` the environment variable that sets it (a short alias); ``credential``: the
    market's credential (enabled without one of them is a mistake ``config check`` and ``serve`` refuse).
    :mod:`broker.config` derives ``SECRETS``, ``ALIASES``, ``CREDENTIALS`` and the log redactor's list from
    these marks."""
    return Field(default=None, json_schema_extra={"lockstep_secret": {"file": file, "env": env,
                                                                      "credential": credential}}, **kw)


def alias(env: str, default: Any) -> Any:
    """A setting with a short environment name (``LOCKSTEP_VAST_URL``): setting it also enables the section's
    market, unless the file or ``LOCKSTEP_<SECTION>__ENABLED`` says otherwise."""
    return Field(default=default, json_schema_extra={"lockstep_alias": env})


class Section(BaseModel):
    """A configuration section: a key it does not know is a mistake, not something to ignore; a number that is
    not finite is one too."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class MarketSection(Section):
    """A market's settings (``providers/<market>/config.py``; the registry gives its key, e.g. ``vast:`` in the file
    and ``LOCKSTEP_VAST__<FIELD>`` in the environment). Its fields declare what the core derives: ``secret`` (its
    credential, masked, refused inline), ``alias`` (a short environment name that also switches it on)."""

    enabled: bool = False

    def check_with_broker(self, provider_timeout_s: float) -> None:
        """Raise ``ValueError("field: why")`` where this section contradicts the broker's settings: checked when
        the whole configuration loads, for an enabled market. ``provider_timeout_s``: how long the broker waits for
        one call to a market (``broker.provider_timeout_s``)."""


class RuntimeConfig(Section):
    """The in-job wrapper's settings, the same on every market (docs/runtime.md)."""

    log_interval_s: Seconds = 5.0  # how often a node ships its log while the command runs
    grace_s: float = Field(default=30.0, ge=0, le=DAY)  # TERM → KILL when a command is stopped
    rendezvous_wait_s: Seconds = 900.0  # how long a node waits for its peers' addresses


