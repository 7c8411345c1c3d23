"""How Lockstep's logs look: plain text for a terminal, JSON lines for a log pipeline.

    lockstep --log-format json serve        (or LOCKSTEP_LOG_FORMAT=json)

Each JSON line has ``time`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``, and, when
the code that logged knows them, ``job_id``, ``tenant`` and ``provider`` as fields of their own.
Code attaches them with ``extra`` or, for several lines about one job, an adapter::

    log = logging.getLogger(__name__)
    log.info("placed on %s", offer.sku, extra=fields(job_id=job.id, tenant=job.tenant, provider="aws"))
    jlog = bind(log, job_id=job.id, tenant=job.tenant)   # every line from jlog carries both
    jlog.warning("launch failed", extra=fields(provider="vast"))

Secrets never appear: every secret value the configuration holds (``load_settings`` registers
them) is replaced by ``**********`` in the formatted line, traceback included, in both formats.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Iterable, MutableMapping
from datetime import UTC, datetime
from typing import Any, Literal

FIELDS = ("job_id", "tenant", "provider")  # the context fields a line may carry
MASK = "**********"
FORMATS = ("text", "json")
LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"

_secrets: set[str] = set()
_lock = threading.Lock()
_active = "text"  # the format configure() chose last


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call: the context fields given, the ``None`` ones left out."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise TypeError(f"unknown log fields {sorted(unknown)}; known: {FIELDS}")
    return {k: v for k, v in values.items() if v is not None}


class ContextAdapter(logging.LoggerAdapter[logging.Logger]):
    """A logger whose lines carry fixed context fields; a call's own ``extra`` adds to them."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


def bind(logger: logging.Logger | logging.LoggerAdapter[logging.Logger], **values: Any) -> ContextAdapter:
    """``logger`` with context fields (job_id, tenant, provider) on every line."""
    base = logger.logger if isinstance(logger, logging.LoggerAdapter) else logger
    inherited = dict(logger.extra or {}) if isinstance(logger, logging.LoggerAdapter) else {}
    return ContextAdapter(base, {**inherited, **fields(**values)})


def register_secrets(values: Iterable[str | None]) -> None:
    """Values never to print; short ones are ignored (masking "a" would mangle every line)."""
    with _lock:
        _secrets.update(v for v in values if v and len(v) >= 6)


def redact(text: str) -> str:
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)  # a secret containing another is masked whole
    for s in secrets:
        if s in text:
            text = text.replace(s, MASK)
    return text


class TextFormatter(logging.Formatter):
    """``LEVEL logger: message [job_id=… tenant=… provider=…]``, secrets masked."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ctx = " ".join(f"{k}={getattr(record, k)}" for k in FIELDS if getattr(record, k, None) is not None)
        if ctx:
            head, sep, rest = line.partition("\n")  # after the message, before a traceback
            line = f"{head} [{ctx}]{sep}{rest}"
        return redact(line)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context fields, the exception."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        # Masked after encoding too: a secret is never split by JSON escaping of plain text.
        return redact(json.dumps(out, ensure_ascii=False, default=str))


def formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return TextFormatter()
    raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")


def configure(fmt: str | None = None, level: str | int | None = None) -> None:
    """Format every root handler's lines (one stderr handler if there is none).

    ``fmt``: "text" or "json"; default ``LOCKSTEP_LOG_FORMAT`` or text. ``level``: the root level, if given.
    """
    global _active
    chosen = (fmt or os.environ.get("LOCKSTEP_LOG_FORMAT") or "text").strip().lower()
    form = formatter(chosen)
    _active = chosen
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler(sys.stderr))
    for handler in root.handlers:
        handler.setFormatter(form)
    if level is not None:
        root.setLevel(level)


def active_format() -> str:
    """"text" or "json": what :func:`configure` set (text before it runs)."""
    return _active
