"""The on-prem Slurm pool (slurmrestd): provider, client, auth, errors, offers, queue, requests, api."""

from providers.slurm.provider import SlurmProvider

__all__ = ["SlurmProvider"]
