"""The logs service over a market in memory (standins/memory.py) and a real store on both backends: the
broker masks secret values again when it serves a log (whatever the wrapper did), merges a multi-node job's
nodes by time, and says clearly when a market serves no logs. The same against the real markets:
tests/vast/test_logs_spend.py, tests/runtime/test_aws_logs_spend.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig, SecretsConfig, Settings
from broker.errors import NotFoundError
from broker.models import Allocation, LogLine
from broker.service import Lockstep
from broker.service.logs import merge
from broker.store import Store
from providers.capabilities import HasJobLogs
from standins.memory import MemoryProvider, offer, spec

SECRET = "pl41n-s3cret-0b9e"


class LoggingMarket(HasJobLogs, MemoryProvider):
    """Serves each node's log as set in ``logs`` (an older wrapper that did not mask, say)."""

    logs: dict[int, str] = {}

    async def job_log(self, alloc: Allocation, *, rank: int = 0) -> str:
        return self.logs.get(rank, "")


async def _placed(store: Store, tmp_path: Path, market: MemoryProvider, **spec_fields: object) -> tuple[Lockstep, str]:
    (tmp_path / "tok").write_text(SECRET)
    settings = Settings(db_url=store.url, broker=BrokerConfig(installation="mem"),
                        secrets=SecretsConfig(files={"tok": str(tmp_path / "tok")}))
    svc = Lockstep(settings, providers={"mem": market}, store=store)
    job = await svc.submit(spec(secrets={"HF_TOKEN": "tok"}, **spec_fields), tenant="alpha")
    await svc.place_now([job.id])
    assert (await svc.get_job(job.id)).placement is not None
    return svc, job.id


async def test_the_broker_masks_secrets_again_and_merges_nodes_by_time(store: Store, tmp_path: Path) -> None:
    market = LoggingMarket("mem", [offer("mem", "a", 2.0)])
    market.logs = {0: f"2026-12-01T04:00:01.000Z out step 1 token={SECRET}\n2026-12-01T04:00:03.000Z out step 3\n",
                   1: "2026-12-01T04:00:02.000Z err step 2 on node 1\nno time here\n"}
    svc, job_id = await _placed(store, tmp_path, market, gpus=2, gpus_per_node=1)
    try:
        lines = await svc.job_logs(job_id, "alpha")
        assert [(ln.rank, ln.text) for ln in lines] == [
            (0, "step 1 token=*****"), (1, "step 2 on node 1"), (1, "no time here"), (0, "step 3")]
        assert await svc.job_logs(job_id, "alpha", tail=1) == lines[-1:]
        assert await svc.job_logs(job_id, "alpha", tail=0) == []
        with pytest.raises(NotFoundError):
            await svc.job_logs(job_id, "beta")  # another tenant's job
        with pytest.raises(NotFoundError):
            await svc.follow_logs(job_id, "beta")
    finally:
        await svc.aclose()


async def test_a_market_that_serves_no_logs_is_named(store: Store, tmp_path: Path) -> None:
    svc, job_id = await _placed(store, tmp_path, MemoryProvider("mem", [offer("mem", "a", 2.0)]))
    try:
        for call in (svc.job_logs(job_id), svc.follow_logs(job_id)):
            with pytest.raises(NotFoundError, match=r"its market \(mem\) serves no job logs"):
                await call
    finally:
        await svc.aclose()


def test_merge_keeps_each_nodes_order() -> None:
    from datetime import UTC, datetime

    t = [datetime(2026, 12, 1, 4, 0, s, tzinfo=UTC) for s in range(4)]
    a = [LogLine(at=t[2], text="a1"), LogLine(text="a2 (no time)"), LogLine(at=t[0], text="a3 clock went back")]
    b = [LogLine(at=t[1], text="b1", rank=1), LogLine(at=t[3], text="b2", rank=1)]
    got = [ln.text for ln in merge({0: a, 1: b})]
    assert got == ["b1", "a1", "a2 (no time)", "a3 clock went back", "b2"]
