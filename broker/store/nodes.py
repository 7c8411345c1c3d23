"""Nodes in the store: benchmarks (with the health gates' verdict) and which nodes are out of the pool."""

from __future__ import annotations

import sqlalchemy as sa

from broker.models import Benchmark, utcnow
from broker.store.engine import Database
from broker.tables import BenchmarkRow, NodeHealthRow, table_of

BENCHES = table_of(BenchmarkRow)
HEALTH = table_of(NodeHealthRow)


class NodeStore(Database):
    """Benchmarks and node health."""

    def add_benchmark(self, b: Benchmark) -> int:
        with self._tx() as conn:
            res = conn.execute(
                BENCHES.insert().values(
                    provider=b.provider,
                    target=b.target,
                    gpu=b.gpu,
                    healthy=b.healthy,
                    measured_at=b.measured_at,
                    body=b.model_dump(mode="json"),
                )
            )
            key = res.inserted_primary_key
            assert key is not None  # a one-row insert always has its new id
            return int(key[0])

    def benchmarks(
        self, provider: str | None = None, target: str | None = None, latest_only: bool = True
    ) -> list[Benchmark]:
        """Benchmarks newest first; with ``latest_only`` one per (provider, target)."""
        q = sa.select(BENCHES.c.provider, BENCHES.c.target, BENCHES.c.body)
        if provider is not None:
            q = q.where(BENCHES.c.provider == provider)
        if target is not None:
            q = q.where(BENCHES.c.target == target)
        q = q.order_by(BENCHES.c.measured_at.desc(), BENCHES.c.id.desc())
        out: list[Benchmark] = []
        seen: set[tuple[str, str]] = set()
        with self._tx(write=False) as conn:
            for prov, tgt, body in conn.execute(q):
                if latest_only:
                    if (prov, tgt) in seen:
                        continue
                    seen.add((prov, tgt))
                out.append(Benchmark.model_validate(body))
        return out

    def set_node_health(self, provider: str, node: str, healthy: bool, reason: str = "") -> None:
        stmt = self._insert_fn()(HEALTH).values(
            provider=provider, node=node, healthy=healthy, reason=reason, updated_at=utcnow()
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=["provider", "node"],
            set_={
                "healthy": stmt.excluded.healthy,
                "reason": stmt.excluded.reason,
                "updated_at": stmt.excluded.updated_at,
            },
        )
        with self._tx() as conn:
            conn.execute(stmt)

    def unhealthy_nodes(self, provider: str | None = None) -> dict[tuple[str, str], str]:
        q = sa.select(HEALTH.c.provider, HEALTH.c.node, HEALTH.c.reason).where(HEALTH.c.healthy.is_(False))
        if provider is not None:
            q = q.where(HEALTH.c.provider == provider)
        with self._tx(write=False) as conn:
            return {(p, n): r for p, n, r in conn.execute(q)}
