"""Log lines: JSON lines for a pipeline (--log-format json / LOCKSTEP_LOG_FORMAT), context fields, no secrets."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker import logconfig
from tests.conftest import ROOT


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A real logger writing through a real handler into a buffer, with the JSON formatter."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logconfig.JsonFormatter())
    log = logging.getLogger("lockstep.test.logconfig")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    yield log, buf
    log.removeHandler(handler)


def lines(buf: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_json_lines_carry_time_level_logger_message_and_context_fields(captured) -> None:
    log, buf = captured
    log.info("plain %s", "line")
    jlog = logconfig.bind(log, job_id="j-123", tenant="alpha")
    jlog.warning("launch failed", extra=logconfig.fields(provider="vast"))
    logconfig.bind(jlog, provider="aws").error("boom")
    first, second, third = lines(buf)
    assert set(first) == {"time", "level", "logger", "message"}
    assert (first["level"], first["logger"], first["message"]) == ("INFO", "lockstep.test.logconfig", "plain line")
    assert first["time"].endswith("+00:00") and "T" in first["time"]
    assert second == {**second, "job_id": "j-123", "tenant": "alpha", "provider": "vast", "level": "WARNING"}
    assert (third["job_id"], third["provider"]) == ("j-123", "aws")
    with pytest.raises(TypeError, match="unknown log fields"):
        logconfig.fields(jobid="x")


def test_secrets_are_masked_in_messages_and_tracebacks(captured) -> None:
    log, buf = captured
    logconfig.register_secrets(["tok-very-secret-99"])
    try:
        raise RuntimeError("refused tok-very-secret-99")
    except RuntimeError:
        log.exception("call with %s failed", "tok-very-secret-99")
    (line,) = lines(buf)
    assert "tok-very-secret-99" not in buf.getvalue()
    assert line["message"] == "call with ********** failed" and "RuntimeError: refused **********" in line["exception"]
    text = logconfig.TextFormatter().format(logging.makeLogRecord(
        {"name": "x", "levelname": "INFO", "msg": "key tok-very-secret-99", "job_id": "j-1"}))
    assert text == "INFO x: key ********** [job_id=j-1]"


@pytest.mark.parametrize("how", ["option", "env"])
def test_serve_logs_json_lines_without_secrets(tmp_path: Path, how: str) -> None:
    """A real `lockstep serve`: every stderr line is a JSON object; a secret in a request line is masked."""
    secret = "vk-log-secret-4242"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["LOCKSTEP_VAST_API_KEY"] = secret
    env["LOCKSTEP_VAST__ENABLED"] = "false"  # the key is configured (so known as a secret), never used
    args = [sys.executable, "-m", "broker"]
    if how == "option":
        args += ["--log-format", "json"]
    else:
        env["LOCKSTEP_LOG_FORMAT"] = "json"
    proc = subprocess.Popen([*args, "--db", str(tmp_path / "s.db"), "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("lockstep: serving on http://127.0.0.1:"), line
        url = line.split()[-1]
        # A client that put the key in a URL: the access log line must not show it.
        assert httpx.get(f"{url}/healthz", params={"key": secret}, timeout=30).status_code == 200
        assert httpx.get(f"{url}/v1/jobs", timeout=30).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    records = [json.loads(x) for x in err.splitlines() if x.strip()]
    assert records, "serve logged nothing"
    for r in records:
        assert {"time", "level", "logger", "message"} <= set(r)
    assert any(r["logger"] == "broker.api.app" and r["message"].startswith("serving on") for r in records)
    assert any(r["logger"] == "lockstep.access" and "/healthz" in r["message"] for r in records)
    assert secret not in err
