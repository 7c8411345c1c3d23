"""The real `lockstep` command: the README's first command, JSON contract, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from broker.cli import main
from broker.cli.app import Command, LazyGroup

ROOT = Path(__file__).resolve().parents[2]


def lockstep(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["LOCKSTEP_DB"] = f"sqlite:///{tmp_path / 'cli.db'}"
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)


def test_quote_70b_every_option_meets_fabric_and_colocation(tmp_path: Path) -> None:
    r = lockstep("quote", "examples/llama-70b-pretrain.yaml", "--json", "--top", "20", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    q = json.loads(r.stdout)
    assert set(q) >= {"job", "options", "rejected"}
    assert q["options"], "the 70B example must have options"
    for o in q["options"]:
        assert {"provider", "market", "sku", "region", "zone", "nodes", "gpus_per_node", "gpu", "fabric",
                "fabric_gbps", "usd_per_hour", "expected_hours", "expected_cost_usd"} <= set(o)
        assert o["provider"] != "vast"
        assert o["fabric"] in ("infiniband", "efa", "roce") and o["fabric_gbps"] >= 400
        assert o["nodes"] == 8
    costs = [o["expected_cost_usd"] for o in q["options"]]
    assert costs == sorted(costs)
    assert any(r["provider"] == "vast" for r in q["rejected"])
    assert all({"provider", "sku", "region", "reason"} <= set(r) for r in q["rejected"])


def test_quote_1gpu_all_under_cap(tmp_path: Path) -> None:
    r = lockstep("quote", "examples/finetune-1gpu.yaml", "--json", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    q = json.loads(r.stdout)
    assert q["options"] and all(o["usd_per_hour"] <= 1.0 for o in q["options"])


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("name: x\ngpu: A100\ngpus: 2\nworkload: {hours: 1}\ncolour: red\n", "colour: unknown field"),
        ("name: x\ngpu: A100\ngpus: -2\nworkload: {hours: 1}\n", "gpus: Input should be greater than 0"),
        ("name: x\ngpu: A100\ngpus: 12\ngpus_per_node: 8\nworkload: {hours: 1}\n", "gpus_per_node: gpus (12)"),
        # Garbage is bad input; a name shaped like a GPU model no market offers is an answer (exit 3, below).
        ("name: x\ngpu: 'Q9000 !!'\ngpus: 1\nworkload: {hours: 1}\n", "gpu: 'Q9000 !!' is not a GPU model name"),
        ("name: x\ngpu: [A100\n", "malformed YAML"),
    ],
)
def test_bad_spec_exit_2_one_line(tmp_path: Path, content: str, needle: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(content)
    r = lockstep("quote", str(f), tmp_path=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_gpu_model_no_market_offers_exit_3(tmp_path: Path) -> None:
    # Deliberate change (issue 17): an unknown name that looks like a GPU model used to be exit 2;
    # it is an answer about the market ("no market offers Q9000"), not bad input.
    f = tmp_path / "q9000.yaml"
    f.write_text("name: x\ngpu: Q9000\ngpus: 1\nworkload: {hours: 1}\n")
    r = lockstep("quote", str(f), tmp_path=tmp_path)
    assert r.returncode == 3, r.stderr
    assert "no market offers Q9000" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = lockstep("quote", str(f), "--json", tmp_path=tmp_path)
    assert r.returncode == 3 and json.loads(r.stdout)["notes"] == ["no market offers Q9000"]


def test_missing_file_and_bad_option_exit_2(tmp_path: Path) -> None:
    r = lockstep("quote", str(tmp_path / "nope.yaml"), tmp_path=tmp_path)
    assert r.returncode == 2 and "no such file" in r.stderr
    r = lockstep("offers", "--fabric", "pigeon", tmp_path=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_infeasible_exit_3_with_grouped_reasons(tmp_path: Path) -> None:
    f = tmp_path / "huge.yaml"
    f.write_text("name: huge\ngpu: H100\ngpus: 4096\nfabric: infiniband\ncolocate: rack\nworkload: {hours: 1}\n")
    r = lockstep("quote", str(f), tmp_path=tmp_path)
    assert r.returncode == 3
    assert "no feasible option" in r.stderr and "×" in r.stderr


def test_offers_filters(tmp_path: Path) -> None:
    r = lockstep("offers", "--gpu", "H100", "--fabric", "rdma", "--min-gpus", "8", "--market", "on_demand",
                 "--max-price", "120", "--json", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    offers = json.loads(r.stdout)
    assert offers
    for o in offers:
        assert o["gpu"].startswith("H100") and o["gpu_count"] >= 8 and o["market"] == "on_demand"
        assert o["usd_per_hour"] <= 120 and o["network"]["fabric"] in ("infiniband", "efa", "roce")


# --------------------------------------------------------------------------- the command list and start-up

_LOADED = """
import sys
from broker.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(" ".join(sorted(sys.modules)), file=sys.stderr)
"""


def loaded_modules(*args: str, tmp_path: Path) -> set[str]:
    """Modules a real `lockstep` process has imported by the time the command is done."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["LOCKSTEP_DB"] = f"sqlite:///{tmp_path / 'cli.db'}"
    r = subprocess.run([sys.executable, "-c", _LOADED, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=120)
    return set(r.stderr.strip().splitlines()[-1].split())


def test_every_listed_command_loads_and_says_what_the_list_says() -> None:
    from broker.cli import COMMANDS
    from broker.cli.app import load

    assert len({c.name for c in COMMANDS}) == len(COMMANDS)
    for entry in COMMANDS:
        command = load(entry)  # imports its module: a broken one fails here, loudly
        assert command.name == entry.name
        assert (command.help or "").strip().splitlines()[0] == entry.help, entry.name


def test_help_lists_every_command_without_importing_any(tmp_path: Path) -> None:
    from broker.cli import COMMANDS

    r = lockstep("--help", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    commands = r.stdout.split("Commands:", 1)[1]  # click's plain layout: "  name   help", help lines indented more
    listed = [line.split()[0] for line in commands.splitlines() if line.startswith("  ") and line[2:3] != " "]
    assert [c.name for c in COMMANDS] == [n for n in listed if n in {c.name for c in COMMANDS}]
    loaded = loaded_modules("--help", tmp_path=tmp_path)
    assert not {m for m in loaded if m.startswith(("broker.cli.", "broker.service", "broker.store"))} - {
        "broker.cli.app", "broker.cli.root"}
    assert not loaded & {"numpy", "sqlalchemy", "aiohttp", "pydantic", "broker.models", "broker.config", "rich"}


def test_a_command_imports_only_what_it_uses(tmp_path: Path) -> None:
    quote = loaded_modules("quote", "examples/finetune-1gpu.yaml", "--json", tmp_path=tmp_path)
    assert "broker.cli.quote" in quote and "policies.ranking" in quote
    assert not quote & {"alembic", "aiohttp", "httpx", "broker.store", "broker.tables", "broker.cli.prices",
                        "broker.cli.admin", "broker.cli.jobs", "matplotlib", "sqlalchemy", "rich", "broker.lifecycle"}
    tokens = loaded_modules("tokens", "list", tmp_path=tmp_path)
    assert "broker.store" in tokens and "broker.service.tenants" in tokens
    assert not tokens & {"numpy", "aiohttp", "broker.market", "broker.cli.quote", "broker.cli.prices"}


def root_with(*entries: Command) -> typer.Typer:
    """A root app like `lockstep`'s that lists only ``entries``."""
    group = type("Listed", (LazyGroup,), {"commands_table": {e.name: e for e in entries}})
    root = typer.Typer(cls=group, add_completion=False)
    root.callback()(lambda: None)
    return root


def test_a_broken_command_is_listed_and_fails_loudly(capsys: pytest.CaptureFixture[str]) -> None:
    root = root_with(Command("gone", "broker.cli.no_such_module:command", "A command whose module broke."))
    with pytest.raises(SystemExit) as done:
        main(["--help"], root)
    assert done.value.code == 0 and "A command whose module broke." in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["gone"], root)
    assert done.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("lockstep: internal error: ModuleNotFoundError") and len(err.strip().splitlines()) == 1
