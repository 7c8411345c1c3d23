"""Which providers this installation talks to, built from the one Settings model."""

from __future__ import annotations

from broker.config import Settings
from providers.base import Provider


def build_providers(settings: Settings, only: list[str] | None = None) -> dict[str, Provider]:
    """Provider objects for every enabled market (``only`` narrows it, e.g. ``--provider slurm``).

    Imports are local so a missing optional dependency of one adapter cannot
    break the others (and the CLI starts fast).
    """
    wanted = set(only) if only else None
    inst = settings.broker.installation
    out: dict[str, Provider] = {}

    def want(name: str, enabled: bool) -> bool:
        return (wanted is None and enabled) or (wanted is not None and name in wanted)

    if want("catalog", settings.catalog.enabled):
        from providers.catalog import CatalogProvider

        out["catalog"] = CatalogProvider(path=settings.catalog.path)
    if want("slurm", settings.slurm.enabled):
        from providers.slurm import SlurmProvider

        out["slurm"] = SlurmProvider(settings.slurm, installation=inst)
    if want("aws", settings.aws.enabled):
        from providers.aws import AwsProvider

        out["aws"] = AwsProvider(settings.aws, installation=inst)
    if want("reserved", settings.aws.enabled and (settings.aws.capacity_reservations
                                                  or bool(settings.aws.reserved_pools))):
        from providers.reserved import ReservedProvider

        # One AWS adapter for both markets: shared clients and instance-type cache, one placement-group list.
        out["reserved"] = ReservedProvider(settings.aws, installation=inst, aws=out.get("aws"))
    if want("vast", settings.vast.enabled):
        from providers.vast import VastProvider

        out["vast"] = VastProvider(settings.vast, installation=inst)
    return out
