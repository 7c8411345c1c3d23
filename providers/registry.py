"""Which providers this installation talks to, built from the one Settings model.

The only place that knows every market by name: the core gets a ``{name: Provider}``
mapping and asks each provider what it can do (:mod:`providers.capabilities`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from broker.config import Settings
from providers.base import Provider


@dataclass(frozen=True)
class _Market:
    enabled: Callable[[Settings], bool]
    # (settings, installation, providers built so far) → the provider. Imports are inside, so a
    # missing optional dependency of one adapter cannot break the others (and the CLI starts fast).
    build: Callable[[Settings, str, dict[str, Provider]], Provider]
    setup: str = ""  # what switches it on, for a user told it is missing
    # What `lockstep config check` says about it beyond problems (e.g. which run-time reporting applies, and why).
    notes: Callable[[Settings], list[str]] = lambda s: []


def _catalog(s: Settings, inst: str, built: dict[str, Provider]) -> Provider:
    from providers.catalog import CatalogProvider

    return CatalogProvider(path=s.catalog.path)


def _slurm(s: Settings, inst: str, built: dict[str, Provider]) -> Provider:
    from providers.slurm import SlurmProvider

    return SlurmProvider(s.slurm, installation=inst)


def _aws(s: Settings, inst: str, built: dict[str, Provider]) -> Provider:
    from providers.aws import AwsProvider

    return AwsProvider(s.aws, installation=inst)


def _aws_notes(s: Settings) -> list[str]:
    from providers.aws.uploads import config_note, static_credentials

    return [config_note(s.aws, static_credentials(s.aws.profile))]


def _reserved(s: Settings, inst: str, built: dict[str, Provider]) -> Provider:
    from providers.aws import AwsProvider, ReservedProvider

    # One AWS adapter for both markets: shared clients and instance-type cache, one placement-group list.
    aws = built.get("aws")
    return ReservedProvider(s.aws, installation=inst, aws=aws if isinstance(aws, AwsProvider) else None)


def _vast(s: Settings, inst: str, built: dict[str, Provider]) -> Provider:
    from providers.vast import VastProvider

    return VastProvider(s.vast, installation=inst)


# In build order: "reserved" shares the "aws" adapter built before it.
MARKETS: dict[str, _Market] = {
    "catalog": _Market(lambda s: s.catalog.enabled, _catalog),
    "slurm": _Market(lambda s: s.slurm.enabled, _slurm, "slurm.enabled: true and slurm.url (docs/slurm.md)"),
    "aws": _Market(lambda s: s.aws.enabled, _aws,
                   "aws.enabled: true and AWS credentials, e.g. AWS_PROFILE (docs/aws.md)", _aws_notes),
    "reserved": _Market(
        lambda s: s.aws.enabled and (s.aws.capacity_reservations or bool(s.aws.reserved_pools)), _reserved
    ),
    "vast": _Market(lambda s: s.vast.enabled, _vast,
                    "vast.enabled: true and vast.api_key, e.g. LOCKSTEP_VAST_API_KEY (docs/vast.md)"),
}


def configured(settings: Settings, name: str) -> bool:
    """Is market ``name`` switched on in ``settings``? False for a name that is no market."""
    market = MARKETS.get(name)
    return market is not None and market.enabled(settings)


def config_notes(settings: Settings) -> list[str]:
    """What the enabled markets say about their configuration (`lockstep config check` prints it)."""
    return [note for market in MARKETS.values() if market.enabled(settings) for note in market.notes(settings)]


def how_to_enable(name: str) -> str:
    """What to configure to switch market ``name`` on ('' when it cannot be switched on by itself)."""
    market = MARKETS.get(name)
    return market.setup if market is not None else ""


def build_providers(settings: Settings, only: list[str] | None = None) -> dict[str, Provider]:
    """Provider objects for every enabled market (``only`` narrows it, e.g. ``--provider slurm``,
    and builds the markets it names whether switched on or not)."""
    wanted = set(only) if only else None
    inst = settings.broker.installation
    out: dict[str, Provider] = {}
    for name, market in MARKETS.items():
        if (wanted is None and market.enabled(settings)) or (wanted is not None and name in wanted):
            out[name] = market.build(settings, inst, out)
    return out
