"""The run-time contract on Vast (docs/runtime.md, docs/vast.md): the container *is* the job.

Pure functions. Each machine of a launch is created with ``runtype: "args"``: ``onstart`` is then the
container's entrypoint (``sh``) and ``args`` its arguments, a bootstrap that decodes the in-job wrapper
from the environment and runs it with the image's ``python3``. The wrapper and its manifest travel in
the create body's ``env`` (gzip + base64); the wrapper echoes its time-stamped lines to the container's
stdout and ends with a ``LOCKSTEP-EXIT {...}`` line, which the broker reads back through Vast's logs API.
When the command ends the container exits, and the broker destroys the instance.

A launch of N machines (an assembled multi-node job) is N create bodies with the same manifest
(rendezvous ``env``) and an ``env`` that differs only in ``LOCKSTEP_NODE_RANK`` (:func:`head_env`,
:func:`peers_env`). A container's port is reached from outside only through the port Vast maps it to: the
head asks for Vast's identity form (``-p 70000:70000``, a free port X mapped X:X, told to the container as
``VAST_TCP_PORT_70000``) and listens on X; the others are created once X shows on the head's instance and
are given it. The bootstrap writes that port into the manifest's rendezvous before the wrapper reads it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from broker.models import ExitReason, JobExit
from providers.runtime.logs import exit_from_log, parse_log
from providers.runtime.manifest import (
    REGISTRY_PASSWORD_VAR,
    RunRequest,
    build_manifest,
    encode_blob,
    exit_nonce,
    wrapper_source,
)
from providers.runtime.wrapper import END_MARK_VAR, EXIT_MARKER, NONCE_VAR, WRAPPER_FAILED


def _sh_quoted(text: str) -> str:
    """``text`` for the inside of a single-quoted sh word."""
    return text.replace("'", "'\\''")


WRAPPER_VAR = "LOCKSTEP_WRAPPER"
MANIFEST_VAR = "LOCKSTEP_MANIFEST"
PARTS_VAR = "LOCKSTEP_MANIFEST_PARTS"
# One variable's value at most: Linux refuses a single string above 128 KiB at exec (MAX_ARG_STRLEN).
# A larger manifest (a job's files reach 512 KiB) is split into LOCKSTEP_MANIFEST_0..N-1.
ENV_CHUNK = 64 * 1024
ENTRYPOINT = "sh"
# Vast's identity port form: an internal port of 70000 or more asks for a free port X mapped X:X.
IDENTITY_PORT = 70000
PORT_VAR = f"VAST_TCP_PORT_{IDENTITY_PORT}"  # what Vast tells the container X is
RDZV_PORT_VAR = "LOCKSTEP_VAST_RDZV_PORT"  # "self" (the head: X is its own PORT_VAR) or X (the others)
NO_PYTHON = ("this image has no python3, which Lockstep's run-time wrapper needs (docs/vast.md): "
             "use an image with Python 3.6 or later")

# The entrypoint's script: say clearly when the image cannot run the wrapper (no python3, one older than 3.6),
# else run python3 — not exec'd: this shell stays PID 1, passes the signals Vast and docker send on to the
# wrapper (a PID 1 without a handler would drop them), and prints the exit line itself when the wrapper died
# before its own (its end mark says how far it got). $1 is the Python bootstrap below (an argument of its
# own: no quoting of one language inside another).
def _exit_line(why: str, code: str) -> str:
    """An ``echo`` of an exit line, for the shell (it expands the nonce, the rank and ``code``)."""
    assert not set('"$`\\') & set(why), why  # plain text only: it goes inside double quotes
    doc = json.dumps({"exit_code": "@CODE@", "reason": "error", "rank": "@RANK@", "last_lines": [why]})
    doc = doc.replace('"@CODE@"', code).replace('"@RANK@"', "${LOCKSTEP_NODE_RANK:-0}")
    return f'echo "{EXIT_MARKER}${{{NONCE_VAR}}} ' + doc.replace('"', '\\"') + '"'


_DIED = "the wrapper ended without its exit status (killed, or out of memory)"
_OLD_PYTHON = "this image's python3 is older than 3.6, which Lockstep's run-time wrapper needs (docs/vast.md)"
BOOT_SH = (
    "if ! command -v python3 >/dev/null 2>&1; then\n"
    f"  echo 'lockstep-run: {_sh_quoted(NO_PYTHON)}'\n"
    f"  {_exit_line(NO_PYTHON, str(WRAPPER_FAILED))}\n"
    f"  exit {WRAPPER_FAILED}\n"
    "fi\n"
    "if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 6))'; then\n"
    f"  echo 'lockstep-run: {_sh_quoted(_OLD_PYTHON)}'\n"
    f"  {_exit_line(_OLD_PYTHON, str(WRAPPER_FAILED))}\n"
    f"  exit {WRAPPER_FAILED}\n"
    "fi\n"
    f'M="${{TMPDIR:-/tmp}}/lockstep-end.$$"; rm -f "$M"; export {END_MARK_VAR}="$M"\n'
    'python3 -c "$1" &\n'
    "pid=$!\n"
    "for s in TERM INT HUP USR1 USR2; do trap \"kill -$s $pid 2>/dev/null\" $s; done\n"
    # wait returns early when a trapped signal comes: wait again until the wrapper is gone.
    'while :; do wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null || break; done\n'
    'if ! grep -qx exit-line "$M" 2>/dev/null; then\n'
    f"  echo 'lockstep-run: {_sh_quoted(_DIED)}'\n"
    f"  {_exit_line(_DIED, '$rc')}\n"
    "fi\n"
    'exit "$rc"\n'
)
# Joins a split manifest, takes the wrapper out of the environment (the command does not see either) and
# runs it as the main program: it reads its manifest from LOCKSTEP_MANIFEST.
BOOT_PY = (
    "import base64,gzip,os,sys\n"
    "e=os.environ\n"
    f"n=int(e.pop('{PARTS_VAR}','0') or 0)\n"
    f"if n: e['{MANIFEST_VAR}']=''.join(e.pop('{MANIFEST_VAR}_%d'%i) for i in range(n))\n"
    f"r=e.pop('{RDZV_PORT_VAR}','')\n"
    "if r:\n"
    " import json\n"
    f" m=json.loads(gzip.decompress(base64.b64decode(e['{MANIFEST_VAR}'])))\n"
    f" m['rendezvous']['port']=int(e['{PORT_VAR}'] if r=='self' else r)\n"
    f" e['{MANIFEST_VAR}']=base64.b64encode(gzip.compress(json.dumps(m).encode())).decode()\n"
    f"src=gzip.decompress(base64.b64decode(e.pop('{WRAPPER_VAR}')))\n"
    "sys.argv=['lockstep-run']\n"
    "exec(compile(src,'lockstep-run.py','exec'),{'__name__':'__main__'})\n"
)
BOOT_ARGS = ["-c", BOOT_SH, "lockstep-boot", BOOT_PY]


def node_manifest(run: RunRequest, *, rendezvous: Mapping[str, Any]) -> dict[str, Any]:
    """One machine's manifest: the command runs in this container (no container of its own), its lines go
    to stdout (read back through the logs API) and to a file in its working directory, and nothing shuts
    the machine down (the container exits with the command). The registry password is Vast's to use
    (``image_login``), not the command's."""
    secrets = {k: v for k, v in run.secrets.items() if k != REGISTRY_PASSWORD_VAR}
    return build_manifest(run.model_copy(update={"secrets": secrets}), rendezvous=rendezvous,
                          logs={"stdout": True, "heartbeat_stdout": True})


def single_node() -> dict[str, Any]:
    """The rendezvous of a one-machine job: rank 0 of 1, its own head."""
    return {"mode": "single"}


def head_env(addrs: list[str]) -> dict[str, str]:
    """What the head (rank 0) of a multi-machine job adds to its ``env``: its rank, every machine's address in
    rank order (the wrapper's ``env`` rendezvous turns them into the ``LOCKSTEP_*`` variables), and Vast's
    docker-style option for an identity-mapped port (``-p 70000:70000``, as ``vastai create instance --env``
    sends options): its rendezvous port is the one Vast picks."""
    return {"LOCKSTEP_NODE_RANK": "0", "LOCKSTEP_NODE_ADDRS": ",".join(addrs),
            f"-p {IDENTITY_PORT}:{IDENTITY_PORT}": "1", RDZV_PORT_VAR: "self"}


def peers_env(rank: int, addrs: list[str], port: int) -> dict[str, str]:
    """What another machine (rank ≥ 1) adds: its rank, the addresses, and the head's mapped port ``port``."""
    return {"LOCKSTEP_NODE_RANK": str(rank), "LOCKSTEP_NODE_ADDRS": ",".join(addrs), RDZV_PORT_VAR: str(port)}


def node_env(run: RunRequest, manifest: Mapping[str, Any]) -> dict[str, str]:
    """The create body's ``env``: the wrapper and the manifest (split when large), plus the job's id and
    attempt in the clear (they show in Vast's console beside the label)."""
    env = {"LOCKSTEP_JOB_ID": run.job_id, "LOCKSTEP_ATTEMPT": str(run.attempt),
           WRAPPER_VAR: encode_blob(wrapper_source()), NONCE_VAR: exit_nonce(run.job_id, run.attempt)}
    blob = encode_blob(manifest)
    if len(blob) <= ENV_CHUNK:
        env[MANIFEST_VAR] = blob
        return env
    parts = [blob[i:i + ENV_CHUNK] for i in range(0, len(blob), ENV_CHUNK)]
    env[PARTS_VAR] = str(len(parts))
    env.update({f"{MANIFEST_VAR}_{i}": part for i, part in enumerate(parts)})
    return env


def image_login(run: RunRequest) -> str | None:
    """Vast's ``image_login`` (``docker login`` arguments) for a private registry; None for a public image."""
    if run.registry is None:
        return None
    password = run.secrets.get(REGISTRY_PASSWORD_VAR)
    if password is None:
        return None
    return f"-u {run.registry.username} -p {password.get_secret_value()} {run.registry.server}"


def node_exit(log: str, status_msg: str = "", nonce: str = "") -> JobExit:
    """How a machine's command ended, from its container's log: the wrapper's ``LOCKSTEP-EXIT <nonce>`` line
    (``nonce``: :func:`~providers.runtime.manifest.exit_nonce` of the attempt), else (a container that ended
    without one: an image that failed to start) a failure saying so, with the log's last lines."""
    found = exit_from_log(log, nonce)
    if found is not None:
        return found
    last = [ln.text for ln in parse_log(log)][-9:]
    why = "the container exited without the wrapper's exit status (no LOCKSTEP-EXIT line in its log)"
    if status_msg:
        why += f"; Vast says: {status_msg[:200]}"
    return JobExit(exit_code=WRAPPER_FAILED, reason=ExitReason.error, last_lines=[*last, why])
