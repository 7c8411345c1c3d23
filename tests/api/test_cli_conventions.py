"""The CLI behaves like its peers: --version, shell completion, --json on every command that prints
data, --server honoured or refused (never a silent local answer), progress on stderr only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.cli import COMMANDS, main
from broker.cli.app import load
from broker.models import Market, PricePoint, utcnow
from broker.store import open_store
from tests.api.conftest import EXAMPLES, ROOT, Api

UNREACHABLE = "http://127.0.0.1:9"  # discard port: nothing listens, the connection is refused at once
SPEC = str(EXAMPLES / "finetune-1gpu.yaml")


def run(*args: str, env: dict[str, str] | None = None, token: str | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    full.update(env or {})
    if token:
        full["LOCKSTEP_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=120,
                          env=full, cwd=ROOT)


def leaves() -> dict[str, Any]:
    """Every command a user can run, by its full name ("prices history"), loaded."""
    out: dict[str, Any] = {}

    def walk(prefix: str, command: Any) -> None:
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(f"{prefix} {name}", sub)
        else:
            out[prefix] = command

    for entry in COMMANDS:
        walk(entry.name, load(entry))
    return out


# --------------------------------------------------------------------------- --version, completion


def test_version() -> None:
    r = run("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"lockstep {version('lockstep')}"


def in_bash(args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """`lockstep ARGS` started from bash, as a user types it: typer detects the shell from its parent."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env.update(HOME=str(home), SHELL="/bin/bash")
    # "; true": bash must not exec the command in its own place (it would no longer be the parent).
    return subprocess.run(["bash", "-c", f"{sys.executable} -m broker {args}; true"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)


def test_shell_completion_shows_installs_and_completes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    shown = in_bash("--show-completion", home)
    assert "_LOCKSTEP_COMPLETE=complete_bash" in shown.stdout and "complete " in shown.stdout, shown.stderr

    installed = in_bash("--install-completion", home)
    assert "bash completion installed" in installed.stdout, installed.stderr
    assert "_LOCKSTEP_COMPLETE" in "".join(p.read_text() for p in home.rglob("*") if p.is_file())

    def complete(words: str, cword: int) -> list[str]:
        r = run(env={"_LOCKSTEP_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)})
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert complete("lockstep qu", 1) == ["quote"]
    assert complete("lockstep prices hi", 2) == ["history"]  # a group loaded on demand
    assert "--market" in complete("lockstep offers --mar", 2)


# --------------------------------------------------------------------------- --json

# serve prints only the line scripts wait for ("serving on URL"), logs go to stderr; server run is what local
# commands start in the background (its output is its log); server logs prints that log as it is
NO_DATA = {"serve", "server run", "server logs"}


def test_every_command_that_prints_data_has_json() -> None:
    found = leaves()
    assert len(found) >= 25
    missing = [name for name, cmd in found.items() if name not in NO_DATA
               and not any("--json" in getattr(p, "opts", ()) for p in cmd.params)]  # typer may vendor click
    assert missing == []


# --------------------------------------------------------------------------- --server

HONOURED = {  # through the server: an unreachable one is exit 1, "cannot reach the server"
    "submit": ["submit", SPEC], "jobs": ["jobs"], "status": ["status", "j1"], "cancel": ["cancel", "j1"],
    "logs": ["logs", "j1"],
    "quote": ["quote", SPEC], "offers": ["offers"], "gpus": ["gpus"],
    "tokens create": ["tokens", "create", "--tenant", "acme"], "tokens list": ["tokens", "list"],
    "tokens revoke": ["tokens", "revoke", "tok_x"],
    "tenants create": ["tenants", "create", "acme"], "tenants list": ["tenants", "list"],
    "tenants set-budget": ["tenants", "set-budget", "acme", "--max-gpus", "8"],
    "prices history": ["prices", "history"],
}
REFUSED = {  # the local store or this machine's providers only: one line naming --server, exit 2
    "serve": ["serve", "--port", "0"], "burnin": ["burnin", "node-1"],
    "bench record": ["bench", "record", "x.json", "--provider", "slurm", "--target", "n1"],
    "bench list": ["bench", "list"], "bench resume": ["bench", "resume", "n1"],
    "prices alerts": ["prices", "alerts"], "prices track": ["prices", "track", "--once"],
    "advise": ["advise", "--from-history"],  # with --pods it reads a file, no store
    "server status": ["server", "status"], "server stop": ["server", "stop"], "server logs": ["server", "logs"],
    "server run": ["server", "run"],  # the local background broker
}
NO_STORE = {  # read files or measure this machine; no store, nothing a server would answer differently
    "probe", "bench parse-nccl", "prices replay", "simulate deadline", "simulate cluster", "config check",
    "config show",
}


def test_every_command_is_classified_for_server() -> None:
    names = set(leaves())
    assert names == set(HONOURED) | set(REFUSED) | NO_STORE, "classify a new command in this test and docs/api.md"
    assert not (set(HONOURED) & set(REFUSED)) and not (set(HONOURED) | set(REFUSED)) & NO_STORE


def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(args)
    out, err = capsys.readouterr()
    return int(done.value.code or 0), out, err


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("LOCKSTEP_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("LOCKSTEP_DB", f"sqlite:///{tmp_path / 'local.db'}")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_local_only_commands_refuse_a_server(name: str, clean_env: None, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _main(["--server", UNREACHABLE, *REFUSED[name]], capsys)
    assert code == 2, (name, out, err)
    assert len(err.strip().splitlines()) == 1 and "--server" in err and f"`lockstep {name.split(' --')[0]}" in err
    assert out == ""
    assert not (tmp_path / "local.db").exists()  # refused before touching the local store


@pytest.mark.parametrize("name", sorted(HONOURED))
def test_server_commands_go_to_the_server(name: str, clean_env: None, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _main(["--server", UNREACHABLE, *HONOURED[name]], capsys)
    assert code == 1, (name, out, err)
    assert "cannot reach the server" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "local.db").exists()  # no local answer, not even an empty one


def test_tokens_and_tenants_through_the_server(api: Api) -> None:
    created = run("--server", api.url, "tokens", "create", "--tenant", "ops", "--role", "metrics",
                  "--label", "prom", "--json", token=api.admin)
    assert created.returncode == 0, created.stderr
    made = json.loads(created.stdout)
    assert made["role"] == "metrics" and made["token"].startswith("lst_")
    with api.client(made["token"]) as scraper:
        assert scraper.get("/metrics").status_code == 200
        assert scraper.get("/v1/jobs").status_code == 403

    listed = run("--server", api.url, "tokens", "list", "--tenant", "ops", "--json", token=api.admin)
    assert made["id"] in {t["id"] for t in json.loads(listed.stdout)}
    assert "token" not in listed.stdout.replace('"tokens', "")  # never a secret in a listing
    revoked = run("--server", api.url, "tokens", "revoke", made["id"], "--json", token=api.admin)
    assert revoked.returncode == 0 and json.loads(revoked.stdout) == {"revoked": made["id"]}
    with api.client(made["token"]) as scraper:
        assert scraper.get("/metrics").status_code == 401

    t = run("--server", api.url, "tenants", "create", "cli-remote", "--budget", "100", "--json", token=api.admin)
    assert t.returncode == 0, t.stderr
    assert json.loads(t.stdout)["monthly_budget_usd"] == 100
    s = run("--server", api.url, "tenants", "set-budget", "cli-remote", "--max-gpus", "16", "--json",
            token=api.admin)
    assert json.loads(s.stdout)["max_gpus"] == 16 and json.loads(s.stdout)["monthly_budget_usd"] == 100
    everyone = json.loads(run("--server", api.url, "tenants", "list", "--json", token=api.admin).stdout)
    assert {"name": "cli-remote", "max_gpus": 16} .items() <= next(
        x for x in everyone if x["name"] == "cli-remote").items()
    # A user token is refused by the server, and the CLI says so in one line.
    denied = run("--server", api.url, "tenants", "list", token=api.alice)
    assert denied.returncode == 1 and "not allowed" in denied.stderr and len(denied.stderr.splitlines()) == 1


def test_price_history_through_the_server_is_the_servers(api: Api, tmp_path: Path) -> None:
    now = utcnow()
    # A provider of its own: the session's server is shared with tests that count H100 points.
    points = [PricePoint(provider="cli-remote", market=Market.spot, sku="l40s.cli", gpu="L40S", region="r1",
                         zone="r1a", usd_per_hour=p, at=now - timedelta(hours=h))
              for h, p in ((30, 3.0), (20, 3.5), (10, 2.25))]
    with open_store(api.db_url) as store:
        store.add_price_points(points)
    remote = run("--server", api.url, "prices", "history", "--provider", "cli-remote", "--since", "2d", "--json",
                 token=api.alice)
    assert remote.returncode == 0, remote.stderr
    got = [(p["sku"], p["usd_per_hour"]) for p in json.loads(remote.stdout)]
    assert got == [("l40s.cli", 3.0), ("l40s.cli", 3.5), ("l40s.cli", 2.25)]
    local = run("--db", str(tmp_path / "empty.db"), "prices", "history", "--provider", "cli-remote", "--json")
    assert local.returncode == 0 and json.loads(local.stdout) == []  # the other store: what used to be read


# --------------------------------------------------------------------------- progress on stderr


def test_tracker_run_shows_progress_on_stderr_and_keeps_json_clean(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'track.db'}"
    r = run("--db", db, "prices", "track", "--once", "--provider", "catalog", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)  # stdout is the JSON document and nothing else
    assert report["leader"] is True and "sources" in report
    assert "lockstep: polling the markets and storing their prices…" in r.stderr

    j = run("--log-format", "json", "--db", db, "prices", "track", "--once", "--provider", "catalog", "--json")
    assert j.returncode == 0, j.stderr
    json.loads(j.stdout)
    lines = [json.loads(x) for x in j.stderr.splitlines() if x.strip()]  # every stderr line is a JSON record
    assert any(x["logger"] == "lockstep.progress" and x["message"].startswith("polling") for x in lines)


def test_serve_shows_start_up_progress_on_stderr(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    proc = subprocess.Popen([sys.executable, "-m", "broker", "--db", str(tmp_path / "s.db"), "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("lockstep: serving on http://127.0.0.1:"), line
        assert httpx.get(line.split()[-1] + "/healthz", timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert out == ""  # the one line above, nothing else on stdout
    assert err.splitlines()[0] == "lockstep: starting: opening the store, reconciling jobs with the providers…"
