"""The type checker's configuration covers what it must (issue 13): scripts/test runs mypy, and mypy
passing proves only what it was asked to check, so a loosened pyproject.toml would pass silently.
These read the configuration through mypy's own parser and compare it with mypy's own --strict.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

main = pytest.importorskip("mypy.main", reason="mypy is in the test extra")
mypy_options = pytest.importorskip("mypy.options")

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "providers", "policies")
# The decision core and the domain model every layer imports: strict, whatever else is.
STRICT = ["broker.models", *sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "policies").rglob("*.py")
)]
# Third-party modules without types or stubs, each allowed to be missing on its own.
UNTYPED = ("torch", "torch.distributed", "plotext")


def _options(*args: str) -> tuple[list[Any], Any]:
    sources, options = main.process_options(list(args))
    return sources, options


@pytest.fixture(scope="module")
def configured() -> tuple[list[Any], Any]:
    here = os.getcwd()
    os.chdir(ROOT)  # `files` in the configuration are relative to the repository root
    try:
        return _options("--config-file", str(ROOT / "pyproject.toml"))
    finally:
        os.chdir(here)


def _strict_flags() -> dict[str, Any]:
    """What mypy's --strict changes from the defaults, asked of the installed mypy."""
    _, plain = _options("--config-file", "", "-c", "pass")
    _, strict = _options("--config-file", "", "--strict", "-c", "pass")
    names = [n for n in dir(plain) if not n.startswith("_") and not callable(getattr(plain, n))]
    return {n: getattr(strict, n) for n in names if getattr(plain, n) != getattr(strict, n)}


def test_every_module_of_the_three_packages_is_checked(configured: tuple[list[Any], Any]) -> None:
    sources, _ = configured
    checked = {Path(s.path).resolve() for s in sources}
    expected = {p.resolve() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    assert expected - checked == set()


def test_strict_modules_get_every_flag_of_strict(configured: tuple[list[Any], Any]) -> None:
    _, options = configured
    flags = _strict_flags()
    assert "disallow_untyped_defs" in flags  # the comparison itself works
    for module in STRICT:
        per_module = options.clone_for_module(module)
        missing = {n: v for n, v in flags.items() if getattr(per_module, n) != v}
        assert missing == {}, f"{module} is not checked with all of --strict"


def test_the_rest_is_checked_inside_unannotated_functions(configured: tuple[list[Any], Any]) -> None:
    _, options = configured
    for module in ("broker.router", "broker.store.prices", "providers.slurm", "providers.runtime.wrapper"):
        assert options.clone_for_module(module).check_untyped_defs, module


def test_missing_types_are_allowed_package_by_package(configured: tuple[list[Any], Any]) -> None:
    _, options = configured
    assert not options.ignore_missing_imports  # no global switch
    assert not options.clone_for_module("yaml").ignore_missing_imports  # it has stubs (types-PyYAML)
    for module in UNTYPED:
        assert options.clone_for_module(module).ignore_missing_imports, module


def test_every_ignore_names_its_error(configured: tuple[list[Any], Any]) -> None:
    _, options = configured
    assert "ignore-without-code" in {str(c) for c in options.enable_error_code}
    assert options.warn_unused_ignores


def test_ci_runs_the_type_checker() -> None:
    steps = [line.split("#")[0].split() for line in (ROOT / "scripts" / "test").read_text().splitlines()]
    assert ["\"$PY\"", "-m", "mypy"] in steps
