"""Which markets exist: each one's settings section and how its provider is built from it.

The only place that knows every market by name. Each entry names its section (``aws:`` in the file,
``LOCKSTEP_AWS__<FIELD>`` in the environment): the name of its package under providers/, whose ``config.py``
holds the section's model with its env aliases, secret fields and credentials declared on the fields.
:mod:`broker.config` adds every section listed here to ``Settings`` and derives its tables from their fields, so
adding a market touches no core file but this one. The core gets a ``{name: Provider}`` mapping and asks each
provider what it can do (:mod:`providers.capabilities`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from broker.configbase import MarketSection
from providers.aws.config import AwsConfig
from providers.catalog.config import CatalogConfig
from providers.slurm.config import SlurmConfig
from providers.vast.config import VastConfig

if TYPE_CHECKING:
    from providers.base import Provider

C = TypeVar("C", bound=MarketSection)


class _Broker(Protocol):
    @property
    def installation(self) -> str: ...


class _Settings(Protocol):
    """What the registry reads of ``broker.config.Settings``, which it cannot import (broker.config takes its
    market sections from here): the installation's name; each market's section is read by its key."""

    @property
    def broker(self) -> _Broker: ...


def _on(section: MarketSection) -> bool:
    return section.enabled


@dataclass(frozen=True)
class Market(Generic[C]):
    section: str  # its settings' key, the name of its package under providers/ (two markets may share one)
    settings: type[C]  # that section's model: providers/<section>/config.py
    # (its section, installation, providers built so far) → the provider. Imports are inside, so a
    # missing optional dependency of one adapter cannot break the others (and the CLI starts fast).
    build: Callable[[C, str, dict[str, Provider]], Provider]
    enabled: Callable[[C], bool] = _on
    setup: str = ""  # what switches it on, for a user told it is missing
    # What `lockstep config check` says about it beyond problems (e.g. which run-time reporting applies, and why).
    notes: Callable[[C], list[str]] = lambda section: []

    def of(self, settings: _Settings) -> C:
        """This market's section of ``settings``."""
        section = getattr(settings, self.section)
        if not isinstance(section, self.settings):
            raise TypeError(f"settings.{self.section} is a {type(section).__name__}, not {self.settings.__name__}")
        return section


def _catalog(s: CatalogConfig, inst: str, built: dict[str, Provider]) -> Provider:
    from providers.catalog import CatalogProvider

    return CatalogProvider(path=s.path)


def _slurm(s: SlurmConfig, inst: str, built: dict[str, Provider]) -> Provider:
    from providers.slurm import SlurmProvider

    return SlurmProvider(s, installation=inst)


def _aws(s: AwsConfig, inst: str, built: dict[str, Provider]) -> Provider:
    from providers.aws import AwsProvider

    return AwsProvider(s, installation=inst)


def _aws_notes(s: AwsConfig) -> list[str]:
    from providers.aws.uploads import config_note, static_credentials

    return [config_note(s, static_credentials(s.profile))]


def _reserved(s: AwsConfig, inst: str, built: dict[str, Provider]) -> Provider:
    from providers.aws import AwsProvider, ReservedProvider

    # One AWS adapter for both markets: shared clients and instance-type cache, one placement-group list.
    aws = built.get("aws")
    return ReservedProvider(s, installation=inst, aws=aws if isinstance(aws, AwsProvider) else None)


def _vast(s: VastConfig, inst: str, built: dict[str, Provider]) -> Provider:
    from providers.vast import VastProvider

    return VastProvider(s, installation=inst)


# In build order: "reserved" shares the "aws" adapter built before it. Their sections, in this order, follow
# the core's first keys in Settings (`lockstep config show` lists them so).
MARKETS: dict[str, Market[Any]] = {
    "catalog": Market("catalog", CatalogConfig, _catalog),
    "slurm": Market("slurm", SlurmConfig, _slurm, setup="slurm.enabled: true and slurm.url (docs/slurm.md)"),
    "aws": Market("aws", AwsConfig, _aws, setup="aws.enabled: true and AWS credentials, e.g. AWS_PROFILE (docs/aws.md)",
                  notes=_aws_notes),
    "reserved": Market("aws", AwsConfig, _reserved,
                       enabled=lambda s: s.enabled and (s.capacity_reservations or bool(s.reserved_pools)),
                       setup="aws.enabled: true and aws.capacity_reservations or aws.reserved_pools (docs/aws.md)"),
    "vast": Market("vast", VastConfig, _vast,
                   setup="vast.enabled: true and vast.api_key, e.g. LOCKSTEP_VAST_API_KEY (docs/vast.md)"),
}


def _sections() -> dict[str, type[MarketSection]]:
    out: dict[str, type[MarketSection]] = {}
    for name, market in MARKETS.items():
        if out.setdefault(market.section, market.settings) is not market.settings:
            raise TypeError(f"market {name!r}: section {market.section!r} already has the model "
                            f"{out[market.section].__name__}")
    return out


# Each market's settings section: key → its model, in MARKETS' order (broker.config adds them to Settings).
SECTIONS = _sections()


def configured(settings: _Settings, name: str) -> bool:
    """Is market ``name`` switched on in ``settings``? False for a name that is no market."""
    market = MARKETS.get(name)
    return market is not None and market.enabled(market.of(settings))


def config_notes(settings: _Settings) -> list[str]:
    """What the enabled markets say about their configuration (`lockstep config check` prints it)."""
    return [note for market in MARKETS.values() if market.enabled(market.of(settings))
            for note in market.notes(market.of(settings))]


def how_to_enable(name: str) -> str:
    """What to configure to switch market ``name`` on ('' when it cannot be switched on by itself)."""
    market = MARKETS.get(name)
    return market.setup if market is not None else ""


def build_providers(settings: _Settings, only: list[str] | None = None) -> dict[str, Provider]:
    """Provider objects for every enabled market (``only`` narrows it, e.g. ``--provider slurm``,
    and builds the markets it names whether switched on or not)."""
    wanted = set(only) if only else None
    inst = settings.broker.installation
    out: dict[str, Provider] = {}
    for name, market in MARKETS.items():
        section = market.of(settings)
        if (wanted is None and market.enabled(section)) or (wanted is not None and name in wanted):
            out[name] = market.build(section, inst, out)
    return out
