"""The on-prem pool: a Slurm cluster behind slurmrestd (JWT auth).

Offers come from node GRES, features and partitions (:mod:`.offers`), with a queue
wait per offer (:mod:`.queue`). Launch submits a batch job whose comment carries the
owner, the Lockstep job id and the launch's client token (:mod:`.requests`), so a job
can be found again after a crash (``owned``) and a launch is never submitted twice.
Transport, auth and version differences are the client's (:mod:`.client`, :mod:`.auth`,
:mod:`.api`); this module only sees flat shapes.

Every launch runs the in-job wrapper on each node under ``srun`` (:mod:`.runtime`): its manifest, logs and
exit statuses live in the pool's shared job directory (``slurm.job_dir``), which ``poll``, ``job_log`` and
``end_reported`` read.

Capabilities: launches; drains and resumes nodes; lists its nodes; runs burn-in jobs; job logs; heartbeats; reports a
command's end between polls (the wrapper's status file); Slurm's billing record; signals; hears interruption notices
(an interruptible job is submitted with ``--signal``; the wrapper's notice file in the attempt's folder).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

import providers.slurm.api as api
from broker.errors import BadRequestError, CapacityError, TransientError
from broker.models import Allocation, AllocationState, AllocationStatus, ExitReason, JobExit, Market, Notice, Offer
from providers.base import JOB_TAG, OWNER_TAG, TENANT_TAG, LaunchRequest, OfferQuery
from providers.capabilities import (
    BilledSpan,
    DrainsNodes,
    HasHeartbeat,
    HasJobLogs,
    HearsNotices,
    KeepsBillingRecord,
    NodeUsage,
    ReportsEnd,
    RunsBurnIn,
    SignalsJobs,
)
from providers.runtime.logs import job_exit
from providers.slurm.client import SlurmClient
from providers.slurm.config import SlurmConfig
from providers.slurm.offers import OfferBuilder, node_usage
from providers.slurm.queue import RUNNING_STATES, estimate_wait_hours
from providers.slurm.requests import (
    ATTEMPT_TAG,
    CANCEL_TAG,
    TOKEN_TAG,
    launch_request,
    parse_comment,
    render_labels,
    time_limit_minutes,
)
from providers.slurm.runtime import (
    NO_CONTAINERS,
    NOTICE_LEAD_S,
    AttemptDir,
    JobFiles,
    batch_script,
    exit_without_status,
    no_container_reason,
    notice_signal,
    slurm_exit_code,
    time_limit_min,
)

PROVIDER = "slurm"

_PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SUSPENDED", "RESV_DEL_HOLD"})
_FAILED_STATES = frozenset(
    {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
)


# Node states and flags a RESUME clears; a node in none of them is in service already.
_RESUMABLE_STATES = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"})

# Slurm states in which a job that ran was put back in the queue or lost a node: Lockstep requeues the job
# itself (a new attempt, counted as a preemption), and gives this one back.
_REQUEUED_FLAGS = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})

# The end watch (broker/loops.py) follows a reported end with a poll. When every node's command has ended but
# Slurm still runs the job (the batch script finishing, the epilog: Slurm ends it by itself, uncancelled), that
# poll answers ``running``; the end is then reported again after a growing wait (this, doubled each time, at most
# END_REPORT_AGAIN_MAX_S), not on every look of the watch, so a lingering job costs few slurmrestd calls.
END_REPORT_AGAIN_S = 0.5
END_REPORT_AGAIN_MAX_S = 8.0


class SlurmProvider(RunsBurnIn, DrainsNodes, HasJobLogs, HasHeartbeat, ReportsEnd, KeepsBillingRecord, SignalsJobs,
                    HearsNotices):
    """Slurm via slurmrestd. Thin: translate, call, normalise, map errors."""

    name = PROVIDER

    def __init__(self, config: SlurmConfig, *, installation: str = "lockstep") -> None:
        self.config = config
        self.installation = installation
        self.client = SlurmClient(config)
        self.files = JobFiles(config, installation)
        self._cancelled: set[str] = set()  # job ids this process cancelled (also marked in the comment)
        # Allocation id → (when its end may be reported again, the wait before that): a poll saw every node's
        # end while Slurm still ran the job (see END_REPORT_AGAIN_S).
        self._ending: dict[str, tuple[float, float]] = {}
        self.monotonic: Callable[[], float] = time.monotonic  # the clock of those waits

    def __repr__(self) -> str:
        return (f"SlurmProvider(url={self.config.url!r}, user={self.config.user!r}, "
                f"version={self.client.negotiated!r})")

    async def aclose(self) -> None:
        await self.client.aclose()

    async def queue_wait_hours(
        self, gpus_per_node: int, nodes: int = 1, features: str | None = None, *, gpu_type: str | None = None
    ) -> float:
        """Expected wait before a job of this shape starts (see :func:`estimate_wait_hours`)."""
        node_list, job_list = await asyncio.gather(self.client.nodes(), self.client.jobs())
        return estimate_wait_hours(node_list, job_list, time.time(), gpus_per_node, nodes, features, gpu_type)

    # ------------------------------------------------------------------ offers

    async def offers(self, query: OfferQuery | None = None) -> list[Offer]:
        if query and query.markets and Market.owned not in query.markets:
            return []
        c = self.client
        node_list, part_list, job_list = await asyncio.gather(c.nodes(), c.partitions(), c.jobs())
        return OfferBuilder(self.config, part_list, node_list, job_list, time.time()).build()

    # ------------------------------------------------------------------ launch / poll / release / owned

    async def _find_by_token(self, token: str) -> api.JobInfo | None:
        for job in await self.client.jobs():
            tags = parse_comment(job.comment)
            if tags.get(OWNER_TAG) == self.installation and tags.get(TOKEN_TAG) == token:
                return job
        return None

    async def launch(self, req: LaunchRequest) -> Allocation:
        run = req.run_request()
        if run.image and self.config.container_runtime == NO_CONTAINERS:
            raise BadRequestError(PROVIDER, no_container_reason(), "image")
        estimate = time_limit_minutes(req, self.config.default_time_limit_min)
        interruptible = req.spec.interruptible
        limit = time_limit_min(run, estimate, notice_lead_s=NOTICE_LEAD_S if interruptible else 0.0)
        warn = notice_signal(interruptible, limit)  # --signal: the interruption notice, before the end
        if not run.command.strip():  # no command: hold the allocation until its limit
            run = run.model_copy(update={"command": f"exec sleep {limit * 60}"})
        where = self.files.where(req.job_id, req.attempt)
        submit = launch_request(
            req,
            installation=self.installation,
            gpus_per_node_default=self.config.gpus_per_node_default,
            default_time_limit_min=self.config.default_time_limit_min,
            partition=self.config.partition,
            script=batch_script(where, installation=self.installation, image=run.image,
                                container_runtime=self.config.container_runtime, python=self.config.python,
                                keep_failed_h=self.config.keep_failed_workdirs_h),
            time_limit_min=limit,
            stdout=str(where.batch_output),
            warn=warn,
        )
        rate = self._rate(req)
        await self.client.version()
        async for attempt in self.client.retrying():
            with attempt:
                # Idempotency: a job with this token already exists (an earlier try, or before a crash).
                existing = await self._find_by_token(req.client_token)
                if existing is not None:
                    return self._allocation(existing, offer_id=req.offer.id, usd_per_hour=rate)
                await self.files.stage(run, notice=warn is not None)
                job_id = await self.client.submit_once(submit)
                job = await self.client.job(job_id)
                if job is None:
                    raise TransientError(PROVIDER, f"submitted job {job_id} not visible yet")
                return self._allocation(job, offer_id=req.offer.id, usd_per_hour=rate)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _rate(req: LaunchRequest) -> float:
        per_gpu = req.offer.usd_per_hour / req.offer.gpu_count if req.offer.gpu_count else 0.0
        return per_gpu * (req.spec.gpus_per_node or 0) * req.nodes

    def _allocation(self, job: api.JobInfo, *, offer_id: str = "", usd_per_hour: float = 0.0) -> Allocation:
        tags = parse_comment(job.comment)
        try:
            attempt = int(tags.get(ATTEMPT_TAG, "0"))
        except ValueError:
            attempt = 0
        return Allocation(
            id=f"{PROVIDER}:{self.config.cluster_name}:{job.job_id}",
            job_id=tags.get(JOB_TAG, job.name.removeprefix("lockstep-")),
            attempt=attempt,
            provider=PROVIDER,
            offer_id=offer_id,
            state=self._state(job),
            client_token=tags.get(TOKEN_TAG, ""),
            resource_ids=[str(job.job_id)],
            nodes=job.node_count,
            region=self.config.cluster_name,
            zone=job.partition,
            usd_per_hour=usd_per_hour,
            attrs={
                "slurm_job_id": str(job.job_id),
                "partition": job.partition,
                "name": job.name,
                "tenant": tags.get(TENANT_TAG, ""),
                "nodes": ",".join(job.nodes),
                "job_dir": str(self.files.where(tags.get(JOB_TAG, job.name.removeprefix("lockstep-")), attempt).path),
            },
        )

    def _state(self, job: api.JobInfo) -> AllocationState:
        s = job.state
        if s in _PENDING_STATES:
            return AllocationState.pending
        if s in RUNNING_STATES:
            return AllocationState.running
        if s == "COMPLETED":
            return AllocationState.succeeded
        if s == "PREEMPTED":
            return AllocationState.preempted
        if s == "CANCELLED":
            ours = str(job.job_id) in self._cancelled or parse_comment(job.comment).get(CANCEL_TAG) == "1"
            return AllocationState.released if ours else AllocationState.failed
        if s in _FAILED_STATES:
            return AllocationState.failed
        return AllocationState.unknown

    @staticmethod
    def _job_id(alloc: Allocation) -> str:
        if not alloc.resource_ids:
            raise BadRequestError(PROVIDER, f"allocation {alloc.id} has no Slurm job id")
        return alloc.resource_ids[0]

    def _where(self, alloc: Allocation) -> AttemptDir:
        return self.files.where(alloc.job_id, alloc.attempt)

    @staticmethod
    def _requeued(job: api.JobInfo, alloc: Allocation) -> bool:
        """Did Slurm take the job off its nodes and put it back in the queue (a node failed under it, a
        preemption with requeue)? Lockstep requeues the job itself instead, as a new attempt."""
        if job.state == "NODE_FAIL" or job.flags & _REQUEUED_FLAGS or job.state in _REQUEUED_FLAGS:
            return True
        if job.restart_count > 0 and not job.finished:
            return True  # Slurm's rerun of this attempt (its own requeue): Lockstep's next attempt replaces it
        if job.state != "PENDING":  # not SUSPENDED: a suspended job resumes where it was
            return False
        return alloc.state is AllocationState.running

    async def poll(self, alloc: Allocation) -> AllocationStatus:
        """The job's state from Slurm, and how its command ended from the wrapper's status files.

        A node whose command failed ends the attempt at once (the lifecycle cancels what still runs); when
        every node has ended, Slurm's own end is awaited (no cancel). A requeued or node-failed job answers
        ``preempted``: Lockstep requeues it as a new attempt, counted, with Slurm's reason.
        """
        status = await self._poll(alloc)
        if status.state is not AllocationState.running:
            self._ending.pop(alloc.id, None)
        return status

    async def _poll(self, alloc: Allocation) -> AllocationStatus:
        job_id = self._job_id(alloc)
        job = await self.client.job(job_id)
        where = self._where(alloc)
        if job is None:
            # slurmctld forgets finished jobs after MinJobAge; the status files still say how it ended.
            if job_id in self._cancelled or alloc.state is AllocationState.released:
                return AllocationStatus(state=AllocationState.released, reason="cancelled by Lockstep")
            end = job_exit(await self.files.statuses(where, max(alloc.nodes, 1)), max(alloc.nodes, 1))
            if end is not None:
                return await self._ended_or_noticed(alloc, end, [])
            return AllocationStatus(state=AllocationState.unknown, reason=f"job {job_id} no longer known")
        hosts = list(job.nodes)
        reason = "" if job.reason in ("None", "") else job.reason
        if self._requeued(job, alloc):
            why = f"Slurm job {job_id} {'lost a node' if job.state == 'NODE_FAIL' else 'was requeued'}"
            detail = ", ".join(x for x in (job.state, reason, f"restarts={job.restart_count}") if x)
            return AllocationStatus(state=AllocationState.preempted, reason=f"{why} ({detail})", hosts=hosts)
        state = self._state(job)
        runs_wrapper = TOKEN_TAG in parse_comment(job.comment)  # a launch's job (not a burn-in probe)
        if runs_wrapper and state in (AllocationState.running, AllocationState.succeeded, AllocationState.failed):
            nodes = max(job.node_count, alloc.nodes, 1)
            statuses = await self.files.statuses(where, nodes)
            end = job_exit(statuses, nodes)
            if state is AllocationState.running:
                # A node's command failed, or the head ended while others run: the attempt is over. (A TERM
                # from Slurm — scancel, preemption, a node failure — is Slurm's to explain: wait for it. When
                # every node has ended, the job ends by itself within moments: no cancel.)
                if end is not None and end.reason is not ExitReason.signal and len(statuses) < nodes:
                    return self._ended(end, hosts)
                if end is not None:  # reported, but Slurm's end is awaited: the end watch asks again later
                    self._report_again_later(alloc.id)
                return AllocationStatus(state=state, reason=f"{job.state} {reason}".strip(), hosts=hosts,
                                        started_at=_span(job).start)
            if end is None:
                end = exit_without_status(slurm_exit_code(job.exit_code), job.state, await self.files.log(where, 0),
                                          await self.files.batch_output(where))
            return await self._ended_or_noticed(alloc, end, hosts)
        if job.exit_code and job.state in _FAILED_STATES:
            reason = f"{reason} exit={slurm_exit_code(job.exit_code)}".strip()
        return AllocationStatus(state=state, reason=f"{job.state} {reason}".strip(), hosts=hosts,
                                started_at=_span(job).start if state is AllocationState.running else None)

    def _report_again_later(self, alloc_id: str) -> None:
        _, wait = self._ending.get(alloc_id, (0.0, END_REPORT_AGAIN_S / 2))
        wait = min(wait * 2, END_REPORT_AGAIN_MAX_S)
        self._ending[alloc_id] = (self.monotonic() + wait, wait)

    async def end_reported(self, alloc: Allocation) -> bool:
        """A node's wrapper has recorded this attempt's end: its exit status file in the attempt's own folder of
        the shared job directory (files read in a thread; no slurmrestd call), by :func:`job_exit`'s rule, the
        poll's (a failed node, the head node, or every node). Another attempt's folder never counts (each attempt
        has its own, and a launch clears what an earlier submission of the same attempt left). After a poll that
        still found Slurm running the job, False until :data:`END_REPORT_AGAIN_S`'s wait has passed."""
        if not alloc.resource_ids:
            return False
        again = self._ending.get(alloc.id)
        if again is not None and self.monotonic() < again[0]:
            return False
        nodes = max(alloc.nodes, 1)
        return job_exit(await self.files.statuses(self._where(alloc), nodes), nodes) is not None

    async def notice(self, alloc: Allocation) -> Notice | None:
        """The interruption notice a node's wrapper wrote in this attempt's folder of the shared job directory
        (``notice-<rank>.json``, on Slurm's ``--signal``; the first by rank), read in a thread: no slurmrestd
        call. Slurm names no deadline (its time limit or a preemption's GraceTime ends the job): the lifecycle
        gives the draining job back two minutes after the notice unless its command ends first."""
        if not alloc.resource_ids:
            return None
        return await self.files.notice(self._where(alloc), max(alloc.nodes, 1))

    async def signal(self, alloc: Allocation, name: str = "TERM") -> None:
        await self.client.signal(self._job_id(alloc), name)

    async def billed_span(self, alloc: Allocation) -> BilledSpan | None:
        """Slurm's own record of the job: from its real start to its end. A PENDING job's start_time is only
        Slurm's estimate, and one cancelled while pending ends at its "start": nothing billed either way."""
        job = await self.client.job(self._job_id(alloc)) if alloc.resource_ids else None
        return None if job is None else _span(job)

    async def _ended_or_noticed(self, alloc: Allocation, end: JobExit, hosts: list[str]) -> AllocationStatus:
        """An attempt Slurm has ended. One whose command the wrapper stopped at Slurm's interruption notice
        (``signal``, with a notice file) ended before a poll saw the notice: ``preempted``, so the lifecycle
        requeues the job to resume from its checkpoint, as for any preemption (not failed: its work is not done)."""
        if end.reason is ExitReason.signal:
            notice = await self.files.notice(self._where(alloc), max(alloc.nodes, 1))
            if notice is not None:
                return AllocationStatus(state=AllocationState.preempted, hosts=hosts, exit=end, reason=(
                    f"node {notice.rank}'s command was stopped at Slurm's interruption notice ({notice.action})"))
        return self._ended(end, hosts)

    @staticmethod
    def _ended(end: JobExit, hosts: list[str]) -> AllocationStatus:
        return AllocationStatus(state=AllocationState.succeeded if end.succeeded else AllocationState.failed,
                                reason=end.describe(), hosts=hosts, exit=end)

    async def job_log(self, alloc: Allocation, *, rank: int = 0) -> str:
        """The node's log from the shared job directory ('' before its wrapper started)."""
        return await self.files.log(self._where(alloc), rank)

    async def heartbeat(self, alloc: Allocation, *, rank: int = 0) -> datetime | None:
        """Node ``rank``'s last heartbeat in the shared job directory."""
        return await self.files.heartbeat(self._where(alloc), rank)

    async def release(self, alloc: Allocation) -> None:
        job_id = self._job_id(alloc)
        self._cancelled.add(job_id)
        self._ending.pop(alloc.id, None)
        await self.files.forget(self._where(alloc))  # the manifest holds the job's secret values
        await self.files.fence_past(self._where(alloc))
        job = await self.client.job(job_id)
        if job is None or job.finished:
            return  # already gone
        # Mark the job first, so that another Lockstep process polling it reads "released", not "failed".
        try:
            await self.client.set_comment(job_id, f"{job.comment};{CANCEL_TAG}=1")
        except (BadRequestError, CapacityError):
            pass  # the mark is a courtesy; cancelling is what matters
        await self.client.cancel(job_id)

    async def owned(self) -> list[Allocation]:
        out = []
        for job in await self.client.jobs():
            if job.finished or parse_comment(job.comment).get(OWNER_TAG) != self.installation:
                continue
            out.append(self._allocation(job))
        return out

    # ------------------------------------------------------------------ nodes

    @property
    def pool(self) -> str:
        return self.config.cluster_name

    async def list_nodes(self) -> list[NodeUsage]:
        return [node_usage(n) for n in await self.client.nodes()]

    async def drain(self, node: str, reason: str) -> None:
        """Take a node out of service (running jobs finish, nothing new starts)."""
        await self.client.set_node_state(node, "DRAIN", reason or "lockstep: unhealthy")

    async def resume(self, node: str) -> None:
        """Put a drained or down node back in service; idempotent.

        Slurm refuses a RESUME of a node that is already in service ("Invalid node state specified"): when an
        operator resumed it at Slurm first, that refusal is the state asked for, not an error. Any other
        refusal (the node still drained or down, an unknown node) is raised.
        """
        try:
            await self.client.set_node_state(node, "RESUME", "")
        except BadRequestError:
            info = next((n for n in await self.client.nodes() if n.name == node), None)
            if info is None or info.state & _RESUMABLE_STATES:
                raise

    async def run_on_node(
        self,
        node: str,
        script: str,
        *,
        gpus: int,
        time_limit_min: int,
        log_path: str,
        labels: Mapping[str, str],
    ) -> Allocation:
        """A batch job pinned to ``node`` (no ownership tags, no idempotency), in a partition holding it.

        Submitted through the client's transport (auth, error mapping, bounded retries): a retried
        submit can at worst start the job twice.
        """
        info = next((n for n in await self.client.nodes() if n.name == node), None)
        partitions = info.partitions if info is not None else ()
        partition = self.config.partition if self.config.partition in partitions else None
        if partition is None and partitions:
            partition = partitions[0]
        job_id = str(await self.client.submit(api.SubmitRequest(
            name=f"lockstep-burnin-{node}"[:100],
            script=script,
            nodes=1,
            gpus_per_node=gpus,
            gpu_type=info.gpu_type if info is not None else "",
            time_limit_min=time_limit_min,
            comment=render_labels(labels),
            partition=partition,
            stdout=log_path,
            node=node,
        )))
        return Allocation(id=f"{self.name}:burnin:{job_id}", job_id=f"burnin-{node}", provider=self.name,
                          state=AllocationState.pending, resource_ids=[job_id])


def _span(job: api.JobInfo) -> BilledSpan:
    """The billed span of a Slurm job as Slurm records it (see ``SlurmProvider.billed_span``)."""
    if job.state in _PENDING_STATES or not job.start_time:
        return BilledSpan(None, None)
    start = datetime.fromtimestamp(job.start_time, UTC)
    end = datetime.fromtimestamp(job.end_time, UTC) if job.finished and job.end_time else None
    if end is not None and end <= start:
        return BilledSpan(None, end)  # cancelled before it ran
    return BilledSpan(start, end)
