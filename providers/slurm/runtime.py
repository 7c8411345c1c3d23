"""The run-time contract on Slurm (docs/runtime.md, docs/slurm.md "At run time").

Every attempt of a job gets a folder of the pool's shared job directory (``slurm.job_dir``, a path the
broker and every node see; on a one-host cluster any local directory)::

    <job_dir>/<installation>/<job>/
        a<attempt>/wrapper.py          the in-job wrapper, as shipped                 broker writes
        a<attempt>/manifest.json       its manifest, with the job's secrets (0600)    broker writes; deleted by
                                                                                       the batch script once srun
                                                                                       ends, and at release
        a<attempt>/log-<rank>.txt      each node's time-stamped, masked log           wrapper writes, broker reads
        a<attempt>/status-<rank>.json  each node's exit status                        wrapper writes, broker reads
        a<attempt>/heartbeat-<rank>.json  each node's wrapper, alive (every 30 s)     wrapper writes, broker reads
        a<attempt>/notice-<rank>.json  the interruption notice a node heard      wrapper writes, broker reads
        a<attempt>/slurm.out           the batch step's own output (srun's messages)  Slurm writes
        checkpoints/                   LOCKSTEP_CHECKPOINT_DIR of every attempt (unless the spec names one)

The batch script runs on the first node of the allocation: it exports every node's address (``NodeAddr``
of each host of ``SLURM_JOB_NODELIST``, in the allocation's order) and runs the wrapper once per node under
``srun`` (one task per node); each wrapper takes its rank from ``SLURM_NODEID``, so every node computes the
same ``LOCKSTEP_*`` rendezvous set. A job's ``image`` runs through the pool's container runtime: pyxis
(``srun --container-image``; the wrapper then runs inside the image, which needs ``python3``), apptainer (the
wrapper runs on the host and the command in ``apptainer exec docker://…``); a pool with none refuses it.

Interruption notices (issue 30; docs/slurm.md "Interruption notices"): an interruptible job is submitted with
``--signal=USR1@120``; every process of its steps gets SIGUSR1 from Slurm then, and the wrapper (``notice.trap``)
takes it as the notice. The shells Lockstep starts ignore it, and so does the command (its shell starts with
``trap '' USR1``), so only the wrapper acts on it: it sends the command SIGTERM and writes ``notice-<rank>.json``.

Pure functions, plus :class:`JobFiles` for the little file I/O the broker does in the job directory.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from broker.errors import BadRequestError
from broker.models import ExitReason, JobExit, Notice
from providers.runtime.logs import parse_heartbeat, parse_log, parse_notice, parse_status
from providers.runtime.manifest import RunRequest, build_manifest, wrapper_source
from providers.runtime.wrapper import WRAPPER_FAILED
from providers.slurm.config import SlurmConfig

CONTAINERS_ATTR = "containers"  # Offer.attrs: the pool's container runtime ("none": host only)
NO_CONTAINERS = "none"
TIME_LIMIT_MARGIN_S = 120.0  # Slurm's own limit lies this far past max_duration + the wrapper's grace

# Interruption notices (issue 30). USR1: not TERM, which is also how Slurm ends a job (scancel, the broker's release,
# the time limit's end, a preemption without send_user_signal), so the wrapper must keep stopping on it; not USR2,
# left to workloads. The lead matches AWS's two minutes (and the lifecycle's DRAIN_WITHOUT_DEADLINE); Slurm may
# send it up to 60 s sooner (its event resolution), never later.
NOTICE_SIGNAL = "USR1"
NOTICE_LEAD_S = 120
SLURM_NOTICE = {"trap": f"SIG{NOTICE_SIGNAL}", "deliver": "SIGTERM"}  # the manifest's `notice` (wrapper Notices)
# The shells Lockstep starts on the nodes, and the command's, ignore the signal: Slurm sends it to every process of
# the job's steps (proctrack), and only the wrapper is to act on it. A process may still ask for it (a handler).
IGNORE_NOTICE = f"trap '' {NOTICE_SIGNAL}"


def no_container_reason() -> str:
    return ("this pool runs commands on its hosts and has no container runtime for the job's image "
            "(slurm.container_runtime: pyxis or apptainer), so drop `image` or use another pool")


@dataclass(frozen=True)
class AttemptDir:
    """One attempt's folder in the shared job directory."""

    path: Path
    job_path: Path  # every attempt's parent (checkpoints live here)

    @classmethod
    def of(cls, job_dir: str, installation: str, job_id: str, attempt: int) -> AttemptDir:
        job_path = Path(job_dir) / _safe(installation) / _safe(job_id)
        return cls(job_path / f"a{attempt}", job_path)

    @property
    def wrapper(self) -> Path:
        return self.path / "wrapper.py"

    @property
    def manifest(self) -> Path:
        return self.path / "manifest.json"

    @property
    def fence(self) -> Path:
        """The job's fence: the attempt the broker runs now (an earlier attempt's wrapper stops on reading it)."""
        return self.job_path / "fence"

    @property
    def checkpoints(self) -> Path:
        return self.job_path / "checkpoints"

    @property
    def batch_output(self) -> Path:
        return self.path / "slurm.out"

    def log(self, rank: int) -> Path:
        return self.path / f"log-{rank}.txt"

    def status(self, rank: int) -> Path:
        return self.path / f"status-{rank}.json"

    def heartbeat(self, rank: int) -> Path:
        return self.path / f"heartbeat-{rank}.json"

    def notice(self, rank: int) -> Path:
        return self.path / f"notice-{rank}.json"


def _safe(name: str) -> str:
    """A path component: no separators, no leading dots."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).lstrip(".")
    return cleaned or "_"


def slurm_manifest(run: RunRequest, where: AttemptDir, container_runtime: str, *,
                   notice: bool = False) -> dict[str, Any]:
    """The wrapper's manifest (one for every node): rank from Slurm's environment, log and status to the
    shared folder, the command in apptainer when that is the pool's runtime (pyxis wraps the wrapper itself).
    ``notice``: the job is submitted with Slurm's ``--signal`` (:func:`notice_signal`): the wrapper traps it, and
    the command's shell starts ignoring it (Slurm sends it to the command too; the wrapper sends SIGTERM)."""
    if notice:
        run = run.model_copy(update={"command": f"{IGNORE_NOTICE}\n{run.command}"})
    container = None
    if run.image and container_runtime == "apptainer":
        container = {"runtime": "apptainer", "image": run.image}
    return build_manifest(
        run,
        rendezvous={"mode": "env"},
        logs={"file": str(where.path / "log-{rank}.txt"), "status_dir": str(where.path), "stdout": False,
              "fence": str(where.fence)},
        container=container,
        checkpoint_uri="" if run.checkpoint_uri else f"file://{where.checkpoints}/",
        checkpoint_dir="" if run.checkpoint_uri else f"{where.checkpoints}/",
        notice=SLURM_NOTICE if notice else None,
    )


def pyxis_image(image: str) -> str:
    """An image as enroot/pyxis names it: ``registry#repo:tag`` when the name starts with a registry host."""
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost") and "#" not in image:
        return f"{first}#{rest}"
    return image


# The mark a failed attempt leaves in its node-local work folder: the folder is removed once the mark is older
# than slurm.keep_failed_workdirs_h (by the next Lockstep job on that node: nothing else runs there).
FAILED_MARK = ".lockstep-failed"
# Node-local work folders Lockstep names: lockstep-<job>-a<attempt>-n<node>, and before issue 29
# lockstep-<Slurm job id>-n<node> (Slurm's ids restart with each cluster, so those were never removed).
WORKDIR_GLOB = "lockstep-*-n[0-9]*"
LEGACY_WORKDIR_RE = ".*/lockstep-[0-9][0-9]*-n[0-9][0-9]*"  # find -regex: digits only, never a Lockstep id


def workdir_name(where: AttemptDir) -> str:
    """The node-local work folder of this attempt, without the node: Lockstep's job id and attempt, never
    Slurm's job id (which restarts with each cluster and so named an old cluster's folder again)."""
    return f"lockstep-{where.job_path.name}-{where.path.name}"


def _workdir_shell(where: AttemptDir, keep_failed_h: float) -> tuple[str, str]:
    """Shell run before and after the wrapper on every node: sweep expired failed folders, make this one;
    then remove it unless the attempt failed (a released attempt is TERMed by Slurm: removed too)."""
    minutes = math.ceil(keep_failed_h * 60)
    base = '"${TMPDIR:-/tmp}"'
    before = (f'b={base}; '
              # Failed folders whose mark is older than the setting; legacy ones by their own age.
              f'find "$b" -mindepth 2 -maxdepth 2 -path "$b/{WORKDIR_GLOB}/{FAILED_MARK}" -mmin +{minutes} '
              '2>/dev/null | while read -r m; do rm -rf "${m%/*}"; done; '
              f'find "$b" -mindepth 1 -maxdepth 1 -type d -regex "{LEGACY_WORKDIR_RE}" -mmin +{minutes} '
              '-exec rm -rf {} + 2>/dev/null; '
              f'export TMPDIR="$b/{workdir_name(where)}-n${{SLURM_NODEID}}"; mkdir -p "$TMPDIR"; '
              "trap 'rm -rf \"$TMPDIR\"; exit 143' TERM; " + IGNORE_NOTICE + "; ")
    on_failure = f'touch "$TMPDIR/{FAILED_MARK}"' if minutes > 0 else 'rm -rf "$TMPDIR"'
    after = f'rc=$?; if [ "$rc" = 0 ]; then rm -rf "$TMPDIR"; else {on_failure}; fi; exit "$rc"'
    return before, after


def srun_argv(where: AttemptDir, *, image: str | None, container_runtime: str, python: str,
              keep_failed_h: float = 24.0) -> list[str]:
    """The step that runs the wrapper on every node: one task per node, each in a node-local TMPDIR named by
    Lockstep's job and attempt, removed when the attempt succeeds or is released, kept ``keep_failed_h``
    hours when it fails."""
    argv = ["srun", "--export=ALL", "--nodes=${SLURM_JOB_NUM_NODES}", "--ntasks=${SLURM_JOB_NUM_NODES}",
            "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    if image and container_runtime == "pyxis":
        mount = str(where.job_path)
        argv += [f"--container-image={pyxis_image(image)}", f"--container-mounts={mount}:{mount}"]
    # Each node's working directory (where the job's files are unpacked) is its own, even when nodes share
    # /tmp (one host): the wrapper's default workdir lies under TMPDIR.
    # A python3 older than 3.6 (the wrapper's oldest) is refused with one clear line; Slurm ends the job.
    py = shlex.quote(python)
    before, after = _workdir_shell(where, keep_failed_h)
    # Not exec'd: the shell stays to remove the work folder after the wrapper (and on Slurm's TERM at release).
    inner = (before
             + f"{py} -c 'import sys; sys.exit(sys.version_info < (3, 6))' || "
             f'{{ echo "lockstep-run: {python} is missing or older than 3.6, which the wrapper needs" >&2; '
             f"(exit {WRAPPER_FAILED}); {after}; }}; "
             f'{py} {shlex.quote(str(where.wrapper))} {shlex.quote(str(where.manifest))}; {after}')
    return [*argv, "sh", "-c", inner]


def _shell_line(argv: list[str]) -> str:
    """argv as a line of bash, keeping ``${SLURM_…}`` expansions in the srun options."""
    return " ".join(a if a.startswith("--n") and "${" in a else shlex.quote(a) for a in argv)


# Every node's address, in the allocation's order (SLURM_NODEID's order): NodeAddr when slurm.conf sets one,
# else the node's name.
_ADDRS = r'''addrs=""
for h in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
  a=$(scontrol show node -o "$h" 2>/dev/null | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')
  addrs="${addrs:+$addrs,}${a:-$h}"
done
export LOCKSTEP_NODE_ADDRS="$addrs"
'''


def batch_script(where: AttemptDir, *, installation: str, image: str | None, container_runtime: str,
                 python: str, keep_failed_h: float = 24.0) -> str:
    """The batch job of one attempt: the rendezvous addresses, the wrapper under srun on every node, the
    manifest (it holds the secret values) removed once the step ends, the wrapper's exit code as the job's."""
    srun = _shell_line(srun_argv(where, image=image, container_runtime=container_runtime, python=python,
                                 keep_failed_h=keep_failed_h))
    return (
        "#!/bin/bash\n"
        f"# submitted by Lockstep ({installation}): the in-job wrapper on every node (docs/runtime.md)\n"
        + f"{IGNORE_NOTICE}  # the interruption notice is the wrappers' (scancel --full sends it here too)\n"
        + _ADDRS
        + f"{srun}\n"
        + "rc=$?\n"
        + f"rm -f {shlex.quote(str(where.manifest))}\n"
        + "exit $rc\n"
    )


def time_limit_min(run: RunRequest, estimate_min: int, *, notice_lead_s: float = 0.0) -> int:
    """Slurm's time limit: the workload's estimate, but never past max_duration (+ grace + a margin): Slurm
    ends the job even if its wrapper did not stop the command. ``notice_lead_s``: a job submitted with
    ``--signal`` has that much more past max_duration, so the notice never comes before the wrapper's own stop
    (a job at its max_duration is done, not to be placed again)."""
    if not run.max_duration_s:
        return estimate_min
    cap = math.ceil((run.max_duration_s + run.grace_s + TIME_LIMIT_MARGIN_S + notice_lead_s) / 60)
    return max(1, cap)


def notice_signal(interruptible: bool, limit_min: int) -> tuple[str, int] | None:
    """Slurm's ``--signal`` for a job (signal name, seconds before its end), or None: only a job that resumes from
    checkpoints (``interruptible``) is warned, and only when its limit leaves room for the lead plus Slurm's 60 s
    resolution (a shorter job would get it at once)."""
    if not interruptible or limit_min * 60 < NOTICE_LEAD_S + 60:
        return None
    return NOTICE_SIGNAL, NOTICE_LEAD_S


def slurm_exit_code(raw: int | None) -> int | None:
    """slurmrestd 22.05's ``exit_code`` is the wait status (code << 8 | signal); later versions the code."""
    if raw is None:
        return None
    if raw > 255:
        return (raw >> 8) & 0xFF
    return raw


def exit_without_status(code: int | None, state: str, log_text: str, batch_output: str) -> JobExit:
    """How a Slurm job ended whose nodes wrote no status (the wrapper could not run: no python3, a bad
    image, the step refused): Slurm's exit code and what the logs say."""
    lines = [ln.text for ln in parse_log(log_text)][-5:]
    lines += [ln for ln in batch_output.splitlines() if ln.strip()][-4:]
    reason = ExitReason.max_duration if state == "TIMEOUT" else ExitReason.error
    why = f"Slurm job ended {state} without the wrapper's exit status"
    return JobExit(exit_code=code if code else WRAPPER_FAILED, reason=reason, last_lines=[*lines, why][-10:])


# What the wrapper writes of a run's state into the attempt's folder, one file per node (logs are kept).
RUN_STATE_FILES = ("status-*.json", "heartbeat-*.json", "notice-*.json")


class JobFiles:
    """The broker's side of the shared job directory: stage an attempt, read its logs and statuses back."""

    def __init__(self, config: SlurmConfig, installation: str) -> None:
        self.config = config
        self.installation = installation

    def where(self, job_id: str, attempt: int) -> AttemptDir:
        return AttemptDir.of(self.config.job_dir, self.installation, job_id, attempt)

    def _stage(self, where: AttemptDir, manifest: dict[str, Any]) -> None:
        where.path.mkdir(parents=True, exist_ok=True)
        where.checkpoints.mkdir(parents=True, exist_ok=True)
        # A new submission of this attempt: what an earlier one left (its nodes' exit statuses, beats, notices)
        # says nothing of the job about to run, and must not read as its end (poll, end_reported) or its beat.
        for pattern in RUN_STATE_FILES:
            for stale in where.path.glob(pattern):
                stale.unlink(missing_ok=True)
        tmp = where.wrapper.with_suffix(".tmp")
        tmp.write_text(wrapper_source(), encoding="utf-8")
        os.replace(tmp, where.wrapper)
        # The manifest holds secret values: created 0600, never readable by anyone else on a shared filesystem.
        tmp = where.manifest.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, sort_keys=True)
        os.replace(tmp, where.manifest)
        # The fence last, once this attempt is staged: every earlier attempt still running stops (wrapper). Not
        # over an attempt that heard the market's notice: placed again at the notice (make before break), it
        # checkpoints until its command ends or the broker releases it, which moves the fence then (fence_past).
        attempt = int(manifest["env"]["LOCKSTEP_ATTEMPT"])
        if not self._noticed(AttemptDir.of(self.config.job_dir, self.installation, where.job_path.name,
                                           attempt - 1)):
            self._write_fence(where, attempt)

    @staticmethod
    def _write_fence(where: AttemptDir, attempt: int) -> None:
        tmp = where.fence.with_suffix(".tmp")
        tmp.write_text(f"{attempt}\n", encoding="utf-8")
        os.replace(tmp, where.fence)

    def _noticed(self, where: AttemptDir) -> bool:
        return any(parse_notice(self._read(f)) is not None for f in where.path.glob("notice-*.json"))

    def _fence_past(self, where: AttemptDir) -> None:
        if not where.job_path.is_dir():
            return  # not a job this directory runs (a burn-in probe)
        try:
            current = int(self._read(where.fence).strip() or 0)
        except ValueError:
            current = 0
        attempt = int(where.path.name.removeprefix("a") or 0)
        if current <= attempt:
            self._write_fence(where, attempt + 1)

    async def fence_past(self, where: AttemptDir) -> None:
        """At a release: the fence moves past this attempt (if it is not past already), so that its wrapper, were it
        still running where Slurm lost sight of it, stops (a draining attempt's, left unfenced by its replacement)."""
        try:
            await asyncio.to_thread(self._fence_past, where)
        except OSError:
            pass  # the fence is a second line: the release (scancel) is what ends the attempt

    async def stage(self, run: RunRequest, *, notice: bool = False) -> AttemptDir:
        where = self.where(run.job_id, run.attempt)
        manifest = slurm_manifest(run, where, self.config.container_runtime, notice=notice)
        try:
            await asyncio.to_thread(self._stage, where, manifest)
        except OSError as exc:  # a job directory the broker cannot write: configuration, not capacity
            raise BadRequestError("slurm", f"slurm.job_dir: cannot write {where.path} "
                                           f"({exc.strerror or type(exc).__name__})", "job_dir") from None
        return where

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    async def statuses(self, where: AttemptDir, nodes: int) -> dict[int, JobExit]:
        def read() -> dict[int, JobExit]:
            out: dict[int, JobExit] = {}
            for rank in range(nodes):
                ended = parse_status(self._read(where.status(rank)) or "null")
                if ended is not None:
                    out[rank] = ended.model_copy(update={"rank": rank})
            return out

        return await asyncio.to_thread(read)

    async def log(self, where: AttemptDir, rank: int) -> str:
        return await asyncio.to_thread(self._read, where.log(rank))

    async def heartbeat(self, where: AttemptDir, rank: int) -> datetime | None:
        """When a node's wrapper last said it was alive (None: not yet; see ``wrapper_silent``)."""
        return parse_heartbeat(await asyncio.to_thread(self._read, where.heartbeat(rank)))

    async def notice(self, where: AttemptDir, nodes: int) -> Notice | None:
        """The interruption notice the first node (by rank) wrote beside its status; None while none came."""
        def read() -> Notice | None:
            for rank in range(nodes):
                found = parse_notice(self._read(where.notice(rank)))
                if found is not None:
                    return found.model_copy(update={"rank": rank})
            return None

        return await asyncio.to_thread(read)

    async def batch_output(self, where: AttemptDir) -> str:
        return await asyncio.to_thread(self._read, where.batch_output)

    async def forget(self, where: AttemptDir) -> None:
        """Delete the attempt's manifest (it holds the job's secret values); logs and statuses stay."""
        await asyncio.to_thread(where.manifest.unlink, True)
