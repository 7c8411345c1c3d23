"""The on-prem queue model: how long a job of a given shape would wait on the cluster now.

Pure: nodes and jobs (slurmrestd's flat shapes) and a time in, hours out.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterable

import providers.slurm.api as api

RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "STAGE_OUT", "RESIZING", "SIGNALING"})


def constraint_matches(constraint: str | None, features: Iterable[str]) -> bool:
    """Does a node with ``features`` satisfy a Slurm constraint (``a&b``, ``a,b``, ``a|b``, ``[a|b]``)?"""
    if not constraint:
        return True
    have = {f.lower() for f in features}
    text = re.sub(r"[\[\]()]", "", constraint.lower())
    text = re.sub(r"\*\d+", "", text)  # counts ("ib*2") do not change which nodes qualify
    for alternative in text.split("|"):
        wanted = [w.strip() for w in re.split(r"[&,]", alternative) if w.strip()]
        if all(w in have for w in wanted):
            return True
    return False


def estimate_wait_hours(
    nodes: list[api.NodeInfo],
    jobs: list[api.JobInfo],
    now: float,
    gpus_per_node: int,
    nodes_needed: int = 1,
    features: str | None = None,
    gpu_type: str | None = None,
    candidates: set[str] | None = None,
) -> float:
    """How long a job of this shape would wait, in hours (``inf`` if it can never run here).

    The model, simple on purpose: running jobs hold their GPUs until their time
    limit runs out (the limit is what Slurm itself plans with); pending jobs are
    served in priority order, each starting at the first moment enough GPUs are
    free on nodes it may use, and then holding them for its full time limit;
    our job comes last. At each moment every queued job that fits starts (what
    Slurm's backfill does when nothing larger is blocked). Jobs without a limit
    are assumed to run ``slurm_api.UNLIMITED_JOB_HOURS``. More pending jobs on
    the same nodes can only push the answer later.
    """
    return QueueModel(nodes, jobs, now).wait_hours(gpus_per_node, nodes_needed, features, gpu_type, candidates)


class QueueModel:
    """The part of the queue estimate that is the same for every job shape, prepared once.

    An offer refresh asks for the wait of every offer's shape; the healthy nodes, the
    running jobs' release times and the pending queue (with where each pending job may
    run) do not depend on the shape, so they are built here once and every
    :meth:`wait_hours` simulates on its own copies.
    """

    def __init__(self, nodes: list[api.NodeInfo], jobs: list[api.JobInfo], now: float) -> None:
        self.now = now
        self.healthy = {n.name: n for n in nodes if n.healthy and n.gpus_total > 0}
        self.free = {name: n.gpus_free for name, n in self.healthy.items()}
        horizon = api.UNLIMITED_JOB_HOURS * 3600.0
        self.events: list[tuple[float, str, int]] = []
        for job in jobs:
            if job.state not in RUNNING_STATES or job.gpus_per_node <= 0:
                continue
            if job.time_limit_min is None:
                end = now + horizon
            else:
                end = job.end_time or ((job.start_time or now) + job.time_limit_min * 60)
            end = max(end, now + 60.0)  # past its limit: about to be killed
            for name in job.nodes:
                if name in self.free:
                    heapq.heappush(self.events, (end, name, job.gpus_per_node))
        # (gpus, nodes, eligible nodes, hold seconds, is ours)
        self.queue: list[tuple[int, int, list[str], float, bool]] = []
        pending = [j for j in jobs if j.state in ("PENDING",) and j.gpus_per_node > 0]
        pending.sort(key=lambda j: (-j.priority, j.submit_time or 0.0, j.job_id))
        for job in pending:
            where = self.eligible(job.gpus_per_node, job.gpu_type or None, job.constraints or None, None)
            if len(where) < max(job.node_count, 1):
                continue  # can never run here: it blocks nobody
            hold = horizon if job.time_limit_min is None else job.time_limit_min * 60.0
            self.queue.append((job.gpus_per_node, max(job.node_count, 1), where, hold, False))

    def eligible(self, g: int, gtype: str | None, constraint: str | None,
                 partition_nodes: set[str] | None) -> list[str]:
        return [
            name
            for name, n in self.healthy.items()
            if n.gpus_total >= g
            and (not gtype or n.gpu_type == gtype)
            and constraint_matches(constraint, n.features)
            and (partition_nodes is None or name in partition_nodes)
        ]

    def wait_hours(self, gpus_per_node: int, nodes_needed: int = 1, features: str | None = None,
                   gpu_type: str | None = None, candidates: set[str] | None = None) -> float:
        mine = self.eligible(gpus_per_node, gpu_type, features, candidates)
        if len(mine) < nodes_needed or gpus_per_node <= 0:
            return math.inf
        free = dict(self.free)
        events = list(self.events)  # a copy of a heap is a heap
        queue = [*self.queue, (gpus_per_node, nodes_needed, mine, 0.0, True)]
        now = t = self.now
        while True:
            remaining = []
            for g, k, where, hold, ours in queue:
                fits = sorted((n for n in where if free[n] >= g), key=lambda n: (free[n], n))
                if len(fits) >= k:
                    if ours:
                        return (t - now) / 3600.0
                    for name in fits[:k]:  # best fit: keep big holes for big jobs
                        free[name] -= g
                        heapq.heappush(events, (t + hold, name, g))
                else:
                    remaining.append((g, k, where, hold, ours))
            queue = remaining
            if not events:
                return math.inf
            t = events[0][0]
            while events and events[0][0] <= t:
                _, name, g = heapq.heappop(events)
                free[name] += g
