"""`lockstep quote FILE --json` with the background broker up: answered through it (broker/cli/quick.py), the
command's process loading neither the offer book, numpy, the domain models nor typer, and printing the same
document as a quote made in the command's own process. Forms it does not handle fall back to the general
path, which reports errors as always (a bad spec: exit 2, one line naming the field)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.cli import localbroker

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "llama-70b-pretrain.yaml")

_LOADED = """
import sys
from broker.cli import main
sys.argv = ["lockstep", *sys.argv[1:]]
try:
    main()
except SystemExit as e:
    code = e.code
print(" ".join(sorted(sys.modules)), file=sys.stderr)
"""


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    return {**env, "PYTHONPATH": str(ROOT), localbroker.HOME_ENV: str(tmp / "brokers")}


def lockstep(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=180,
                          cwd=tmp, env=_env(tmp))


@pytest.fixture
def broker_up(tmp_path: Path) -> Iterator[str]:
    db = str(tmp_path / "quick.db")
    started = lockstep(tmp_path, "--db", db, "jobs", "--json")  # a job command starts the broker
    assert started.returncode == 0, started.stderr
    try:
        yield db
    finally:
        lockstep(tmp_path, "--db", db, "server", "stop")


def _without_time(quote: dict) -> dict:
    options = [{k: v for k, v in o.items() if k != "age_s"} for o in quote.get("options", [])]
    return {**{k: v for k, v in quote.items() if k != "at"}, "options": options}


def test_quote_json_through_the_broker_loads_no_offer_book(tmp_path: Path, broker_up: str) -> None:
    r = subprocess.run([sys.executable, "-c", _LOADED, "--db", broker_up, "quote", EXAMPLE, "--json"],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path, env=_env(tmp_path))
    loaded = set(r.stderr.strip().splitlines()[-1].split())
    assert "broker.cli.quick" in loaded and "broker.sdk" in loaded
    assert not loaded & {"numpy", "broker.market", "policies.book", "policies.ranking", "broker.models",
                         "pydantic", "typer", "broker.config", "broker.store", "sqlalchemy"}
    through = json.loads(r.stdout)
    here = lockstep(tmp_path, "--db", str(tmp_path / "no-broker.db"), "quote", EXAMPLE, "--json")
    assert here.returncode == 0, here.stderr
    assert through["options"] and _without_time(through) == _without_time(json.loads(here.stdout))
    assert not localbroker.is_running(localbroker.broker_dir(f"sqlite:///{tmp_path / 'no-broker.db'}")) or \
        pytest.fail("a quote started a broker")


def test_other_forms_take_the_general_path(tmp_path: Path, broker_up: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ngpus: 12\ngpus_per_node: 8\nworkload: {hours: 1}\n")
    r = lockstep(tmp_path, "--db", broker_up, "quote", str(bad), "--json")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "gpus_per_node" in r.stderr
    table = lockstep(tmp_path, "--db", broker_up, "quote", EXAMPLE, "--top", "2")  # a table: the models render it
    assert table.returncode == 0 and "job cost" in table.stdout, table.stderr
