"""One placement of one job by a broker process that SIGKILLs itself between two of the placement's writes:
``python -m tests.broker.kill_between_writes --installation NAME --job ID (--after K | --before K)``.

The store's engine events say where it is (the test's own lookout; nothing of the project is changed): a write
transaction is one that ran an INSERT, UPDATE or DELETE. ``--after K``: killed once the K-th write transaction
has committed (its connection handed back to the pool), before anything else; ``--before K``: killed at the
K-th write transaction's first write statement, i.e. after whatever came between it and the one before (the
provider's launch call, before the launch is recorded). A placement's writes: 1 the claim, 2 the attempt
counter and intent, 3 the launch and the job's move to provisioning. Settings as tests/broker/run_broker.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import Any

import sqlalchemy as sa

from tests.broker.run_broker import open_service


def arm(engine: sa.Engine, after: int | None, before: int | None) -> None:
    writes = 0

    def statement(conn: Any, cursor: Any, text: str, *args: Any) -> None:
        if text.lstrip()[:6].upper() not in ("INSERT", "UPDATE", "DELETE") or conn.info.get("write"):
            return
        conn.info["write"] = True
        if before is not None and writes + 1 == before:
            os.kill(os.getpid(), signal.SIGKILL)

    def commit(conn: Any) -> None:
        nonlocal writes
        if conn.info.pop("write", False):
            writes += 1
            if after is not None and writes == after:  # the pool's record of the connection: seen at checkin
                conn.connection.info["kill_at_checkin"] = True

    def checkin(dbapi_conn: Any, record: Any) -> None:
        if record.info.pop("kill_at_checkin", False):
            os.kill(os.getpid(), signal.SIGKILL)

    sa.event.listen(engine, "before_cursor_execute", statement)
    sa.event.listen(engine, "commit", commit)
    sa.event.listen(engine.pool, "checkin", checkin)


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--installation", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--after", type=int)
    ap.add_argument("--before", type=int)
    args = ap.parse_args()
    svc = await open_service(args.installation, 3600.0)
    try:
        await svc.refresh()
        arm(svc.store.engine, args.after, args.before)
        await svc.place_now([args.job])
    finally:
        await svc.aclose()
    print(json.dumps({"survived": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
