"""Every market of the registry runs the kit, with the contract of every capability it declares."""

from __future__ import annotations

import importlib
import pkgutil

import tests.providers
from broker.config import Settings
from providers.registry import MARKETS, build_providers
from tests.providers.kit import CONTRACTS, OffersContract


def kit_classes() -> dict[type, type]:
    """{provider type: its kit class} from every tests/providers/test_contract_*.py module."""
    for info in pkgutil.iter_modules(tests.providers.__path__):
        if info.name.startswith("test_contract_"):
            importlib.import_module(f"tests.providers.{info.name}")
    out: dict[type, type] = {}
    todo = list(OffersContract.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "provider_type" in vars(cls):
            assert cls.provider_type not in out, f"two kit classes for {cls.provider_type.__name__}"
            out[cls.provider_type] = cls
    return out


async def test_every_market_runs_the_kit_for_each_capability_it_declares() -> None:
    providers = build_providers(Settings(), only=list(MARKETS))  # every market, switched on or not
    try:
        assert set(providers) == set(MARKETS)
        kits = kit_classes()
        for name, provider in providers.items():
            kit = kits.get(type(provider))
            assert kit is not None, f"{name}: no kit class for {type(provider).__name__} in tests/providers"
            for capability, contract in CONTRACTS.items():
                if isinstance(provider, capability):
                    assert issubclass(kit, contract), f"{kit.__name__} lacks {contract.__name__}"
    finally:
        for p in providers.values():
            await p.aclose()


def test_every_capability_has_a_kit_contract() -> None:
    """A capability added to providers/capabilities.py without a contract here could never be flagged above."""
    import providers.capabilities as caps
    from providers.base import Provider

    declared = {getattr(caps, name) for name in caps.__all__}
    capabilities = {c for c in declared if isinstance(c, type) and issubclass(c, Provider) and c is not Provider}
    missing = sorted(c.__name__ for c in capabilities - set(CONTRACTS))
    assert capabilities and not missing, f"no kit contract in tests/providers/kit.py for: {', '.join(missing)}"
