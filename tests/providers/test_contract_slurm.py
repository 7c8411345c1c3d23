"""The kit against the local Slurm cluster (deploy/slurm): gpu-node1..3 8×H100 · gpu-node4 8×A100 · gpu-node5 4×L40S."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from broker.models import Offer
from providers.base import OfferQuery
from providers.slurm import SlurmProvider
from providers.slurm.config import SlurmConfig
from tests.plugins.slurm import SlurmCluster
from tests.providers.kit import (
    DrainsNodesContract,
    HasHeartbeatContract,
    HasJobLogsContract,
    HearsNoticesContract,
    KeepsBillingRecordContract,
    LaunchesContract,
    ListsNodesContract,
    OffersContract,
    ReportsEndContract,
    RunsBurnInContract,
    SignalsJobsContract,
    Subject,
)
from tests.slurm.test_newer_api import fake_jwt
from tests.waiting import eventually

pytestmark = pytest.mark.slurm


def most_free(offers: list[Offer]) -> Offer:
    """The single node with the most free GPUs: one GPU of it is taken, never a whole busy node."""
    single = [o for o in offers if o.max_nodes == 1]
    return max(single, key=lambda o: (int(o.attrs["free_gpus"]), o.id))


class TestSlurm(OffersContract, LaunchesContract, DrainsNodesContract, ListsNodesContract, RunsBurnInContract,
                HasJobLogsContract, KeepsBillingRecordContract, SignalsJobsContract, HasHeartbeatContract,
                ReportsEndContract, HearsNoticesContract):
    provider_type = SlurmProvider

    @pytest.fixture
    async def subject(
        self, slurm_cluster: SlurmCluster, slurm_config: SlurmConfig, slurm_installation: str, tmp_path: Path
    ) -> AsyncIterator[Subject]:
        expired = fake_jwt(time.time() - 60)
        refused = slurm_config.model_copy(update={"token": SecretStr(expired)})
        p = SlurmProvider(slurm_config, installation=slurm_installation)
        yield Subject(
            p,
            OfferQuery(gpus=["H100-SXM", "L40S"], min_gpus_per_node=1),
            broken=lambda: SlurmProvider(refused, installation=slurm_installation),
            secrets=[expired, slurm_cluster.token],
            pick=most_free,
            command="sleep 60",
            node="gpu-node5",
            shared_dir=tmp_path,  # the fake nodes run on this host
        )
        # Leave nothing of this installation running (owned() lists COMPLETING jobs too).
        for alloc in await p.owned():
            await p.release(alloc)
        await eventually(p.owned, lambda a: a == [], "kit jobs gone")
        await p.aclose()
