"""Small builders shared by the Vast tests."""

from __future__ import annotations

from broker.models import JobSpec, Offer
from providers.base import LaunchRequest


def job_spec(gpu: str = "RTX-4090", gpus: int = 1, disk_gb: float = 50.0, command: str = "sleep 600") -> JobSpec:
    return JobSpec(name="vast-test", gpu=[gpu], gpus=gpus, workload={"hours": 1.0}, command=command,
                   disk_gb=disk_gb)


def launch_request(offer: Offer, job_id: str, attempt: int = 0, command: str = "sleep 600") -> LaunchRequest:
    spec = job_spec(offer.gpu, offer.gpu_count, disk_gb=50.0, command=command)
    return LaunchRequest(job_id=job_id, attempt=attempt, spec=spec, offer=offer, nodes=1)
