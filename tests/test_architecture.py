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


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out[name] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an import names (``from broker.models import Job`` → ``broker.models``)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(path: Path, module: str) -> set[str]:
    """Every project module ``module`` imports, anywhere in the file (function bodies and TYPE_CHECKING too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {m: _imports(p, m) for m, p in MODULES.items()}

# What each layer may import besides itself (docs/architecture.md, "What may import what").
LEAVES = {"broker.models", "broker.gpus", "broker.errors"}
ALLOWED: dict[str, set[str]] = {
    "policies": LEAVES | {"broker.perf"},
    "providers": LEAVES | {"broker.config"},
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
