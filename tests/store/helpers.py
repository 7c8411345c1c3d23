"""Builders for store tests."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from broker.models import Job, JobSpec, Workload

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def spec(name: str = "train", gpus: int = 8, **kw: object) -> JobSpec:
    return JobSpec(name=name, gpu=["H100"], gpus=gpus, workload=Workload(reference_gpu_hours=100), **kw)


def job(tenant: str = "default", job_id: str | None = None, created: datetime | None = None, **kw: object) -> Job:
    created = created or datetime.now(UTC)
    return Job(
        id=job_id or f"job-{uuid.uuid4().hex[:12]}",
        tenant=tenant,
        spec=spec(**kw),  # type: ignore[arg-type]
        created_at=created,
        updated_at=created,
    )


def hours(n: float) -> timedelta:
    return timedelta(hours=n)
