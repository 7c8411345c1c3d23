"""One tiny TCP barrier for the multi-node tests of every market, started from the rendezvous variables
alone: the head listens on LOCKSTEP_HEAD_ADDR:LOCKSTEP_RDZV_PORT, every other rank connects from its own
address (its entry in LOCKSTEP_NODE_ADDRS), says its rank and waits for the head's "go", sent once all
have arrived. Each node first prints what it was given (``rdzv {json}``); the head then prints
``barrier passed: RANK@ADDRESS ...`` for the ranks that joined it, the others ``barrier passed``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

SCRIPT = '''import json, os, socket, time
env = os.environ
rank, n = int(env["LOCKSTEP_NODE_RANK"]), int(env["LOCKSTEP_NUM_NODES"])
head, port = env["LOCKSTEP_HEAD_ADDR"], int(env["LOCKSTEP_RDZV_PORT"])
addrs = env["LOCKSTEP_NODE_ADDRS"].split(",")
keys = ["LOCKSTEP_NODE_RANK", "LOCKSTEP_NUM_NODES", "LOCKSTEP_HEAD_ADDR", "LOCKSTEP_NODE_ADDRS", "LOCKSTEP_RDZV_PORT",
        "LOCKSTEP_GPUS_PER_NODE", "MASTER_ADDR", "MASTER_PORT", "SLURMD_NODENAME"]
print("rdzv " + json.dumps({k: env[k] for k in keys if k in env}), flush=True)
if rank == 0:
    server = socket.create_server((head, port))
    server.settimeout(120)
    joined = []
    while len(joined) < n - 1:
        conn, (peer, _) = server.accept()
        conn.settimeout(60)
        joined.append((conn, int(conn.recv(16)), peer))
    for conn, _, _ in joined:
        conn.sendall(b"go")
    print("barrier passed: " + " ".join("%d@%s" % (r, p) for _, r, p in sorted(joined, key=lambda j: j[1])),
          flush=True)
else:
    deadline = time.time() + 120
    while True:
        try:
            conn = socket.create_connection((head, port), timeout=5, source_address=(addrs[rank], 0))
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    conn.settimeout(60)
    conn.sendall(str(rank).encode())
    assert conn.recv(2) == b"go"
    print("barrier passed", flush=True)
'''


def check_barrier(logs: Sequence[Sequence[str]], addrs: Sequence[str], port: int, gpus_per_node: int,
                  hosts: Sequence[str] | None = None) -> None:
    """Assert that every node (``logs[rank]``: its stdout lines) was given the same rendezvous (its own rank;
    the head is rank 0's address) and passed the barrier, and that the head saw every other rank arrive from
    its own address. ``hosts``: the Slurm node each rank ran on, where the market says."""
    n = len(logs)
    for rank, lines in enumerate(logs):
        rdzv = [json.loads(t[5:]) for t in lines if t.startswith("rdzv ")]
        want = {"LOCKSTEP_NODE_RANK": str(rank), "LOCKSTEP_NUM_NODES": str(n), "LOCKSTEP_HEAD_ADDR": addrs[0],
                "LOCKSTEP_NODE_ADDRS": ",".join(addrs), "LOCKSTEP_RDZV_PORT": str(port),
                "LOCKSTEP_GPUS_PER_NODE": str(gpus_per_node), "MASTER_ADDR": addrs[0], "MASTER_PORT": str(port)}
        if hosts is not None:
            want["SLURMD_NODENAME"] = hosts[rank]
        assert rdzv == [want], (rank, lines)
        passed = [t for t in lines if t.startswith("barrier passed")]
        joined = " ".join(f"{r}@{addrs[r]}" for r in range(1, n))
        assert passed == ([f"barrier passed: {joined}"] if rank == 0 else ["barrier passed"]), (rank, lines)
