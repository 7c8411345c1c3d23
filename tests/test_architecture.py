"""The layering docs/architecture.md states, checked on the source: what may import what, no import
cycles (``TYPE_CHECKING`` imports counted), and no provider known by name outside providers/.

These read the code as text (ast), so they fail on the commit that breaks a rule, not later.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from providers.registry import MARKETS

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "providers", "policies")


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            out[_module_name(path)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an import names (``from broker.models import Job`` → ``broker.models``)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported_names(path: Path, module: str) -> set[str]:
    """Every name the file imports, absolute (``from .x import y`` in ``a.b`` → ``a.x.y`` and ``a.x``), anywhere in
    the file (function bodies and TYPE_CHECKING too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.update([f"{base}.{a.name}" for a in node.names] + [base])
    return found


def _imports(path: Path, module: str) -> set[str]:
    """Every project module ``module`` imports, anywhere in the file (function bodies and TYPE_CHECKING too)."""
    targets = {_resolve(name) for name in _imported_names(path, module)}
    return {t for t in targets if t is not None and t != module}


GRAPH = {m: _imports(p, m) for m, p in MODULES.items()}

# What each layer may import besides itself (docs/architecture.md, "What may import what").
LEAVES = {"broker.models", "broker.gpus", "broker.errors"}
ALLOWED: dict[str, set[str]] = {
    "policies": LEAVES | {"broker.perf"},
    # The settings' base, not broker.config: that one builds Settings from the registry's markets (a cycle).
    "providers": LEAVES | {"broker.configbase"},
}


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_layer_imports_only_what_it_may(layer: str) -> None:
    wrong = sorted(
        f"{m} → {t}" for m, targets in GRAPH.items() if m.split(".")[0] == layer
        for t in targets if t.split(".")[0] != layer and t not in ALLOWED[layer]
    )
    assert not wrong, "imports across the layering:\n" + "\n".join(wrong)


def test_the_leaves_import_no_other_project_module() -> None:
    wrong = sorted(f"{m} → {t}" for m in LEAVES for t in GRAPH[m] if t not in LEAVES)
    assert not wrong, wrong


def test_the_settings_base_imports_no_project_module() -> None:
    """broker.configbase is what the core's and every market's settings are built from: it stands below both."""
    assert GRAPH["broker.configbase"] == set()


def test_no_import_cycle_between_modules() -> None:
    """Strongly connected components of the import graph (Tarjan): each must be one module.

    A package and its own modules (``broker.cli`` and its commands) may refer to each other: the
    package's ``__init__`` is their index.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # iterative enough for this graph's depth
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)

    def package_index(comp: list[str]) -> bool:
        heads = [m for m in comp if MODULES[m].name == "__init__.py"]
        return len(heads) == 1 and all(m == heads[0] or m.startswith(heads[0] + ".") for m in comp) and all(
            heads[0] in GRAPH[m] or m == heads[0] for m in comp)

    real = [c for c in cycles if not package_index(c)]
    assert not real, f"import cycles: {real}"


def _names_compared(path: Path, names: set[str]) -> list[str]:
    """``x == "slurm"``, ``x in ("aws", ...)``, ``match``-free: every comparison with a market's name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            consts = [side] if isinstance(side, ast.Constant) else (
                list(side.elts) if isinstance(side, ast.Tuple | ast.List | ast.Set) else [])
            for c in consts:
                if isinstance(c, ast.Constant) and c.value in names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} compares with {c.value!r}")
    return found


def _capability_probes(path: Path) -> list[str]:
    """``getattr(provider, "drain", None)`` and ``hasattr(...)`` on a provider-ish object."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            target = ast.unparse(node.args[0]) if node.args else ""
            if "prov" in target.lower() or "market" in target.lower():
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_core_knows_no_provider_by_name_and_probes_no_capability() -> None:
    names = set(MARKETS)
    assert {"aws", "slurm", "vast", "catalog"} <= names  # the check looks for the real names
    found: list[str] = []
    for module, path in MODULES.items():
        if module.split(".")[0] in ("broker", "policies") and module != "broker.config":
            found += _names_compared(path, names) + _capability_probes(path)
    assert not found, "\n".join(found)


# --------------------------------------------------------------------------- each market owns its settings (issue 23)


def test_broker_config_names_no_market() -> None:
    """The markets' sections, aliases, secrets and credentials come from the registry and the markets' own fields:
    broker/config.py names none of them, not even in a comment or an example."""
    text = (ROOT / "broker" / "config.py").read_text(encoding="utf-8").lower()
    names = set(MARKETS) | {s for m in MARKETS.values() for s in (m.section, m.settings.__name__.lower())}
    found = sorted(n for n in names if n.lower() in text)
    assert not found, f"broker/config.py names a market: {found}"
    assert "aws" in names and "vastconfig" in names  # the check looks for the real names


def test_every_market_declares_its_settings_in_its_package() -> None:
    """Each registered market's settings class is defined in providers/<its section>/config.py (a market that
    shares a section, as reserved shares aws's, shares that package's), is a MarketSection, and is what
    Settings holds under that key."""
    from broker.config import Settings
    from broker.configbase import MarketSection

    for name, market in MARKETS.items():
        path = ROOT / "providers" / market.section / "config.py"
        assert path.is_file(), f"market {name}: no {path.relative_to(ROOT)}"
        assert market.settings.__module__ == f"providers.{market.section}.config", name
        assert f"class {market.settings.__name__}(" in path.read_text(encoding="utf-8"), name
        assert issubclass(market.settings, MarketSection), name
        assert Settings.model_fields[market.section].annotation is market.settings, name
    core = {k for k, f in Settings.model_fields.items() if isinstance(f.annotation, type)
            and issubclass(f.annotation, MarketSection)}
    assert core == {m.section for m in MARKETS.values()}  # no market section that the registry does not list


# --------------------------------------------------------------------------- the shells (issue 26)

SHELLS = ("broker.api", "broker.cli", "broker.dashboard")
# What a shell may import besides the shells: the service, the models and the other leaves, the settings it
# builds the service from, reading a spec (input), logging set-up, the package's version, and the SDK client
# (the CLI's remote backend). Never the store, the market, the loops, the router, a provider.
SHELL_MAY_IMPORT = LEAVES | {"broker", "broker.config", "broker.specs", "broker.logconfig", "broker.client",
                             "broker.sdk",
                             "policies.offers"}  # OfferFilter: the offer book's query model
# Known reaches past the service, each in a file another piece of work owns; a fixed one must leave this list
# (the test fails on a stale entry), and no new one may join it.
SHELL_DEBTS: set[str] = set()
# Attributes of the service a shell must not reach for: the facade hands out operations, not its parts.
SERVICE_INTERNALS = {"store", "market", "broker", "_broker", "tracker", "webhooks", "burnin", "_providers",
                     "_store", "_market"}
INTERNAL_DEBTS: set[str] = set()


def _is_shell(module: str) -> bool:
    return any(module == s or module.startswith(s + ".") for s in SHELLS)


def _service_module(module: str) -> bool:
    return module == "broker.service" or module.startswith("broker.service.")


def test_the_shells_import_only_the_service_and_the_models() -> None:
    found = {f"{m} → {t}" for m, targets in GRAPH.items() if _is_shell(m) for t in targets
             if not (_is_shell(t) or _service_module(t) or t in SHELL_MAY_IMPORT)}
    assert not found - SHELL_DEBTS, "shells reaching past the service:\n" + "\n".join(sorted(found - SHELL_DEBTS))
    assert not SHELL_DEBTS - found, f"fixed: take these off SHELL_DEBTS: {sorted(SHELL_DEBTS - found)}"


def _is_service(node: ast.expr) -> bool:
    """An expression that holds the service: ``svc``, ``self.svc``, ``service``, ``request.app[SERVICE]``."""
    text = ast.unparse(node)
    return text in ("svc", "service") or text.endswith((".svc", ".service")) or text.endswith("[SERVICE]")


def test_the_shells_use_no_part_of_the_service() -> None:
    found = set()
    for module, path in MODULES.items():
        if not _is_shell(module):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in SERVICE_INTERNALS and _is_service(node.value):
                found.add(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert not found - INTERNAL_DEBTS, "\n".join(sorted(found - INTERNAL_DEBTS))
    assert not INTERNAL_DEBTS - found, f"fixed: take these off INTERNAL_DEBTS: {sorted(INTERNAL_DEBTS - found)}"


def _package(module: str) -> str:
    path = MODULES[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def test_no_module_imports_another_packages_private_names() -> None:
    """``from broker.service.runtime import _x`` from outside broker.service is a reach into its insides: a
    package's ``_private`` names (and modules) are its own."""
    found = []
    for module, path in MODULES.items():
        mine = _package(module)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                target = _resolve(node.module)
                if target is None:
                    continue
                names = [a.name for a in node.names]
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                private += [p for p in node.module.split(".") if p.startswith("_") and not p.startswith("__")]
                owner = _package(target)
                if private and not (mine == owner or mine.startswith(owner + ".")):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {private} from {node.module}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    if any(p.startswith("_") and not p.startswith("__") for p in parts):
                        target = _resolve(a.name)
                        if target is not None and not mine.startswith(_package(target)):
                            found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name}")
    assert not found, "\n".join(found)


# The store's methods that write allocation rows (issue 24: money has one home, broker/ledger.py).
ALLOCATION_WRITES = frozenset({"add_allocation", "update_allocation", "end_allocation", "open_attempt",
                               "record_launch"})


def _allocation_writes(path: Path) -> list[str]:
    """Calls or references of the store's allocation writers (``store.update_allocation(...)``, or one handed to
    ``asyncio.to_thread``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in ALLOCATION_WRITES]


def test_allocation_rows_are_written_only_by_the_ledger() -> None:
    found: list[str] = []
    for module, path in MODULES.items():
        if module == "broker.ledger" or module.startswith("broker.store"):
            continue
        found += _allocation_writes(path)
    assert not found, "allocation rows are written only by broker/ledger.py:\n" + "\n".join(found)
    # and the check would see one: the ledger itself writes through these names
    assert _allocation_writes(MODULES["broker.ledger"])


# --------------------------------------------------------------------------- stand-ins and benchmarks (issue 29)


def _reaches(folder: str, into: str) -> list[str]:
    """Each module under ``folder`` (bench, standins) that imports ``into`` or one of its modules."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        names = _imported_names(path, _module_name(path))
        found += [f"{path.relative_to(ROOT)} imports {n}" for n in sorted(names)
                  if n == into or n.startswith(into + ".")]
    return found


def test_bench_imports_nothing_from_tests() -> None:
    """bench/ measures the product: what it shares with the tests (a local Vast API, an in-memory market) lives in
    standins/, not in the test suite."""
    found = _reaches("bench", "tests")
    assert not found, "bench/ importing the test suite (move what it needs to standins/):\n" + "\n".join(found)
    assert _reaches("bench", "standins")  # and the check would see one: bench/ imports the stand-ins


def test_the_standins_import_nothing_from_tests() -> None:
    found = _reaches("standins", "tests")
    assert not found, "standins/ importing the test suite:\n" + "\n".join(found)
    assert _reaches("standins", "standins")  # and the check would see one: the Vast server imports its offers


def test_the_product_imports_no_standin() -> None:
    """standins/ is for the tests and bench/ only: broker/, providers/ and policies/ never import it (it is not in
    the wheel)."""
    found = sorted(f"{path.relative_to(ROOT)} imports {n}" for m, path in MODULES.items()
                   for n in _imported_names(path, m) if n == "standins" or n.startswith("standins."))
    assert not found, "the product importing a stand-in:\n" + "\n".join(found)
