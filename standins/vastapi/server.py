"""A local Vast.ai API for tests and demos: aiohttp on loopback, the same shapes as the real endpoints.

Implements what Lockstep's adapter calls, as Vast's official CLI calls it (shared/vast-api-notes.md):

- ``POST /api/v0/bundles/`` (and ``PUT /api/v0/search/asks/`` with ``{"q": ...}``): a search over a deterministic
  market (standins/vastapi/offers.py), with the query operators eq/neq/gt/gte/lt/lte/in/notin, ``order``, ``limit``,
  ``type`` (on-demand | bid | reserved) and ``allocated_storage`` (GiB, priced into ``dph_total``). Numbers may
  come as strings ("0.99"), as the CLI sends them. ``geolocation`` is matched on its country code, as users query it.
- ``PUT /api/v0/asks/{id}/``: rent an ask → ``{"success": true, "new_contract": N}``; a rented or unknown ask
  answers 410 ``{"success": false, "error": "no_such_ask", ...}``; a rented ask leaves the search results.
- ``GET /api/v1/instances/`` (``select_filters``, ``order_by``, ``limit``, ``after_token`` → ``next_token``),
  ``GET /api/v0/instances/{id}/?owner=me`` → ``{"instances": {...}}``, ``DELETE /api/v0/instances/{id}/``.
- ``Authorization: Bearer <key>`` on every ``/api/`` call (401 otherwise).

Containers: an instance created with ``runtype: "args"`` runs its command as a local process (there is no
container engine here, so the image is not pulled: its command runs on this host). As on Vast, ``onstart`` is the
entrypoint of an args launch and ``args`` its arguments; the process gets the create body's ``env`` (and a PATH,
HOME and TMPDIR of its own, in a temp dir), its stdout and stderr go to one log, as ``docker logs`` has them. The
instance is ``loading`` (pulling the image) on its first look, starts its process and is ``running`` on the next,
and is ``exited`` once the process ends (Vast reports no exit code; ``status_msg`` says what docker says).
``DELETE`` kills every process of the container, as ``docker rm -f`` does (each carries ``VASTAPI_CONTAINER``,
so one that started a session of its own is found too); the server kills every container when it stops.
An image in ``VastState.images_without_python`` runs with a PATH that has ``sh`` and no ``python3``.
``runtype: "ssh"`` instances run nothing (their ``onstart`` would run beside an ssh daemon that never exits).

- ``PUT /api/v0/instances/request_logs/{id}/`` with ``{"tail": "N", "filter": "text", "daemon_logs": "true"}``
  → ``{"success": true, "result_url": ...}``: the log as it is now, uploaded to a URL of its own that needs no key
  (S3 on the real service). As on S3, the object is not there yet on the first GET (403 AccessDenied): clients
  poll it, as Vast's CLI does.

Faults for the client's retry and error paths (``VastState.faults`` in process, or ``POST /_admin/faults``):
a fraction of 429/500 answers, a burst of N 429s with ``Retry-After``, the daily search quota 429, a permanent 401,
asks rented by someone else between search and create (the next one, or the Nth from now),
a create whose answer is lost (rented, then 502), and
slow creates (before renting, or between renting and answering).
``/_admin/*`` needs no key: loopback only.

As the real service does (issue 28; Vast's official CLI is run against it in tests/vast/test_official_cli.py):
JSON answers say ``Content-Type: application/json`` exactly; the instance list refuses ``limit`` above 25;
``Faults.rate_limit`` answers 429 per endpoint and key with no Retry-After; instance rows carry no ``is_bid``;
an args launch runs ``entrypoint`` (else ``onstart``, as the CLI sends it); each ``-p A:B`` of a create's ``env``
gets a random external port (``ports``, ``VAST_TCP_PORT_B``), ``-p 70000:70000`` and above the identity form.

Standalone: ``python -m standins.vastapi.server --port 8765 --api-key KEY`` then point ``LOCKSTEP_VAST_URL`` at it.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import copy
import json
import operator
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from standins.vastapi.offers import catalog_anchors, generate_offers

HOURS_PER_MONTH = 730.0
DEFAULT_STORAGE_GIB = 5.0
DEFAULT_SEARCH_LIMIT = 64
QUERY_META = {"order", "type", "limit", "allocated_storage", "disable_bundling", "extra_ids", "show_incompatible"}
STRINGY = {"num_gpus", "gpu_ram", "dph_total", "dph_base", "storage_total_cost", "storage_cost", "min_bid",
           "inet_up", "inet_down", "reliability", "dlperf", "cpu_ram", "disk_space", "cpu_cores_effective"}
OPERATORS = {"eq", "neq", "gt", "gte", "lt", "lte", "in", "notin"}
# Query fields the CLI accepts (offers_fields in vastai 1.9.1) besides the offer's own keys.
EXTRA_QUERY_FIELDS = {"dph_total", "dlperf_per_dphtotal", "flops_per_dphtotal", "storage_total_cost", "score",
                      "is_bid", "driver_version"}


@dataclass
class Faults:
    error_rate: float = 0.0  # share of /api/ calls answered 429 or 500 (half each, seeded)
    burst_429: int = 0  # the next N /api/ calls answer 429
    retry_after_s: float = 1.0  # Retry-After sent with injected 429s
    unauthorized: bool = False  # every /api/ call answers 401 (a revoked key)
    quota_exhausted: bool = False  # searches answer the daily-quota 429
    steal_next_create: int = 0  # the next N creates find their ask just rented by someone else
    lose_next_create: int = 0  # the next N creates rent the ask but answer 502 (the answer is lost)
    steal_create_number: int = 0  # the Nth create from now (1: the next) finds its ask rented by someone else
    slow_create_s: float = 0.0  # creates wait this long before renting (a launch still in flight)
    slow_create_answer_s: float = 0.0  # creates rent at once, then wait this long before answering
    numbers_as_strings: bool = False  # searches answer prices, counts and speeds as strings ("0.42")
    # Vast's rate limit, per endpoint and per key: more than rate_limit calls to one endpoint within
    # rate_window_s answer 429 with no Retry-After (as the real service sends them). 0: no limit.
    rate_limit: int = 0
    rate_window_s: float = 1.0
    seed: int = 1


LIST_LIMIT_MAX = 25  # the instance list's page size: Vast's CLI and SDK clamp to 1..25; more is refused here
IDENTITY_PORT_MIN = 70000  # "-p 70000:70000": Vast picks a free port X and maps X:X (VAST_TCP_PORT_70000=X)
STOP_GRACE_S = 10.0  # docker stop's TERM → KILL
# Every process of a container carries this variable (as every process of a real container is in its PID
# namespace): a process that left the container's process group (a new session) is still found and killed.
CONTAINER_VAR = "VASTAPI_CONTAINER"
_LIVE: set[str] = set()  # the containers still running, for the exit hook


def container_processes(token: str) -> list[int]:
    """The processes of one container, found by the variable they inherited (Linux /proc)."""
    needle = f"{CONTAINER_VAR}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def kill_container(token: str) -> None:
    """SIGKILL every process of a container, until none is left (what removing a container does)."""
    for _ in range(20):
        pids = container_processes(token)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
    _LIVE.discard(token)


def _kill_live_containers() -> None:
    """Backstop for an interpreter that exits without stopping its server: no container outlives it."""
    for token in list(_LIVE):
        kill_container(token)


atexit.register(_kill_live_containers)


class Container:
    """One instance's container, as local processes: the entrypoint + args with the create body's env, stdout
    and stderr into one log file (what ``docker logs`` shows). As in docker, the container ends when its first
    process does (the rest are killed), ``stop`` TERMs that process, and ``remove`` kills every process."""

    def __init__(self, argv: list[str], env: dict[str, str], root: Path, no_python: bool) -> None:
        self.dir = root
        self.log_path = root / "container.log"
        self.token = secrets.token_hex(8)
        home = root / "home"
        home.mkdir(parents=True, exist_ok=True)
        path = os.environ.get("PATH", "/usr/bin:/bin")
        if no_python:  # an image without python3: sh and nothing else on its PATH
            bin_dir = root / "bin"
            bin_dir.mkdir(exist_ok=True)
            sh = shutil.which("sh")
            if sh:
                (bin_dir / "sh").symlink_to(sh)
            path = str(bin_dir)
        full_env = {"PATH": path, "HOME": str(home), "TMPDIR": str(home), "LANG": "C.UTF-8"}
        full_env.update(env)
        full_env[CONTAINER_VAR] = self.token
        exe = shutil.which(argv[0], path=path) if argv else None
        self.returncode: int | None = None
        self.status_msg = ""
        self.stop_at: float | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        if exe is None:
            # docker create fails before anything runs; Vast shows the daemon's error.
            self.returncode = 127
            self.status_msg = (f'Error response from daemon: failed to create task for container: exec: '
                               f'"{argv[0] if argv else ""}": executable file not found in $PATH')
            self.log_path.touch()
            return
        _LIVE.add(self.token)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([exe, *argv[1:]], env=full_env, cwd=home, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def running(self) -> bool:
        """Is the container's first process still running? Notes its end (and KILLs a stopped one past its
        grace period)."""
        if self.proc is None or self.returncode is not None:
            return False
        code = self.proc.poll()
        if code is None:
            if self.stop_at is not None and time.monotonic() > self.stop_at:
                kill_container(self.token)
            return True
        self.returncode = 128 - code if code < 0 else code
        self.status_msg = f"Exited ({self.returncode})"
        kill_container(self.token)  # the container is over: whatever it left behind goes with it
        return False

    def stop(self) -> None:
        """``docker stop``: TERM the first process now, KILL everything after the grace period (on a later look)."""
        if self.proc is not None and self.returncode is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except OSError:
                pass
            self.stop_at = time.monotonic() + STOP_GRACE_S

    def remove(self) -> None:
        """``docker rm -f``: KILL every process, reap the first, delete the files."""
        kill_container(self.token)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""


@dataclass
class VastState:
    api_key: str
    seed: int = 7
    count: int = 400
    anchors: dict[str, float] | None = None
    offers: dict[int, dict[str, Any]] = field(default_factory=dict)
    rented: dict[int, int | None] = field(default_factory=dict)  # ask id → our instance id, None = someone else
    instances: dict[int, dict[str, Any]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    faults: Faults = field(default_factory=Faults)
    next_instance: int = 21_000_000
    containers: dict[int, Container] = field(default_factory=dict)  # instance id → its running command
    daemon_logs: dict[int, list[str]] = field(default_factory=dict)  # instance id → the host daemon's notes
    log_uploads: dict[str, dict[str, Any]] = field(default_factory=dict)  # result URL token → the uploaded log
    images_without_python: set[str] = field(default_factory=set)
    creates_seen: int = 0  # creates since the faults were last set (for steal_create_number)
    calls: dict[str, list[float]] = field(default_factory=dict)  # endpoint → recent call times (rate limit)
    _fault_rng: random.Random = field(default_factory=lambda: random.Random(1))
    _root: Path | None = None

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Back to a fresh market: every ask free, no instances (their containers killed), no faults, an empty
        request log."""
        self.offers = {o["id"]: o for o in generate_offers(self.seed, self.count, self.anchors)}
        self.stop_containers()
        self.rented.clear()
        self.instances.clear()
        self.requests.clear()
        self.daemon_logs.clear()
        self.log_uploads.clear()
        self.images_without_python.clear()
        self.set_faults(Faults())

    def stop_containers(self) -> None:
        """Kill every container's process group (a server that stops leaves nothing running)."""
        for c in self.containers.values():
            c.remove()
        self.containers.clear()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def note(self, instance_id: int, text: str) -> None:
        """A line of the host daemon's log for this instance (``daemon_logs: "true"``)."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        self.daemon_logs.setdefault(instance_id, []).append(f"{stamp} {text}")

    def start_container(self, inst: dict[str, Any]) -> None:
        """Run an args launch's entrypoint + args as a local process (the image itself is not pulled)."""
        iid = inst["id"]
        if inst.get("image_runtype") != "args" or iid in self.containers:
            return
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="vastapi-"))
        # The API reference's ``entrypoint`` field; Vast's CLI (1.9.1) still sends an args launch's entrypoint as
        # ``onstart``, which the service takes when no ``entrypoint`` is given.
        entry = inst.get("_entrypoint") or inst.get("onstart")
        argv = [str(entry)] if entry else []
        argv += [str(a) for a in inst.get("image_args") or []]
        env = {str(k): str(v) for k, v in inst.get("extra_env") or []}
        env.update(self.map_ports(inst))
        box = Container(argv, env, self._root / str(iid), inst.get("image_uuid") in self.images_without_python)
        self.containers[iid] = box
        self.note(iid, f"container for {inst.get('image_uuid')} started" if box.proc else box.status_msg)

    def map_ports(self, inst: dict[str, Any]) -> dict[str, str]:
        """Docker-style ``-p A:B`` options of the create's ``env`` → the instance's ``ports`` (as docker inspect
        shows them) and the ``VAST_TCP_PORT_<internal>`` variables its container gets. A plain mapping gets a
        random external port on the (shared) public address, as on Vast; ``-p 70000:70000`` and above is Vast's
        identity form: a free port X, mapped X:X. Ports show once the container exists. (Here every container is
        a process of this host: a plain mapping is reported, not forwarded.)"""
        ports: dict[str, list[dict[str, str]]] = {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(free_port())}]}
        env: dict[str, str] = {}
        for key, _ in inst.get("extra_env") or []:
            opt = str(key).strip()
            if not opt.startswith("-p "):
                continue
            outer, _, inner = opt[3:].strip().partition(":")
            inner = inner.split("/")[0]
            if not (outer.isdigit() and inner.isdigit()):
                continue
            if int(outer) >= IDENTITY_PORT_MIN and outer == inner:
                chosen = free_port()
                ports[f"{chosen}/tcp"] = [{"HostIp": "0.0.0.0", "HostPort": str(chosen)}]
                env[f"VAST_TCP_PORT_{inner}"] = str(chosen)
            else:
                external = free_port()
                ports[f"{inner}/tcp"] = [{"HostIp": "0.0.0.0", "HostPort": str(external)}]
                env[f"VAST_TCP_PORT_{inner}"] = str(external)
        env["PUBLIC_IPADDR"] = str(inst.get("public_ipaddr") or "")
        inst["ports"] = ports
        return env

    def look(self, inst: dict[str, Any]) -> None:
        """A new instance loads its image, then runs (an args launch starts its command): each look, through the
        list or the show endpoint, moves it one step."""
        if inst["actual_status"] is None:
            inst["actual_status"] = "loading"
            inst["status_msg"] = "Pulling image"
            self.note(inst["id"], f"pulling {inst.get('image_uuid')}")
        elif inst["actual_status"] == "loading":
            inst.update(actual_status="running", status_msg="", uptime_mins=0.1)
            self.start_container(inst)
        self.refresh(inst)

    def limited(self, endpoint: str) -> bool:
        """Is this call over the rate limit of its endpoint? (Counted whether refused or not, as a bucket.)"""
        f = self.faults
        if not f.rate_limit:
            return False
        now = time.monotonic()
        recent = [t for t in self.calls.get(endpoint, []) if now - t < f.rate_window_s]
        recent.append(now)
        self.calls[endpoint] = recent
        return len(recent) > f.rate_limit

    def refresh(self, inst: dict[str, Any]) -> None:
        """A running container whose process ended is ``exited`` (its ``status_msg`` says how, docker's words)."""
        box = self.containers.get(inst["id"])
        if box is None or inst.get("actual_status") not in ("running", "loading"):
            return
        if not box.running():
            inst.update(actual_status="exited", status_msg=box.status_msg)
            self.note(inst["id"], f"container exited: {box.status_msg}")

    def container_log(self, instance_id: int) -> str:
        box = self.containers.get(instance_id)
        return box.log_text() if box is not None else ""

    def outbid(self, instance_id: int) -> None:
        """A higher bid takes an interruptible instance's machine: its container is stopped (docker stop)."""
        inst = self.instances[instance_id]
        # Vast's instance rows carry no is_bid (a field of offers): an outbid instance is one the renter wants
        # running (intended_status) that its host has stopped.
        inst.update(actual_status="exited", cur_state="stopped", intended_status="running",
                    status_msg="stopped: outbid")
        box = self.containers.get(instance_id)
        if box is not None:
            box.stop()
        self.note(instance_id, "container stopped: outbid by a higher bid")

    def vanish(self, instance_id: int) -> None:
        """The instance is gone behind the renter's back (its host died, or someone destroyed it)."""
        if self.destroy(instance_id) is None:
            raise KeyError(instance_id)

    def set_faults(self, faults: Faults) -> None:
        self.faults = faults
        self.creates_seen = 0
        self.calls.clear()
        self._fault_rng = random.Random(faults.seed)

    def rent_by_other(self, ask_id: int) -> None:
        """Someone else rents this ask (between our search and our create)."""
        self.rented[ask_id] = None

    def searches(self) -> list[dict[str, Any]]:
        """Bodies of the searches received, oldest first."""
        return [r["body"] for r in self.requests if r["path"] == "/api/v0/bundles/" and r["method"] == "POST"]

    def set_instance(self, instance_id: int, **fields: Any) -> None:
        """Move an instance along (actual_status, cur_state, intended_status, status_msg...)."""
        self.instances[instance_id].update(fields)

    def destroy(self, instance_id: int) -> dict[str, Any] | None:
        """Destroy an instance: its container killed, its machine back on the market."""
        inst = self.instances.pop(instance_id, None)
        if inst is None:
            return None
        self.rented.pop(inst["ask_id"], None)
        box = self.containers.pop(instance_id, None)
        if box is not None:
            box.remove()
        return inst


# --------------------------------------------------------------------------- the query engine


def _country(geo: Any) -> Any:
    return geo.rsplit(",", 1)[-1].strip() if isinstance(geo, str) else geo


def _coerce(value: Any, like: Any) -> Any:
    """The query's value in the type of the offer's field (the CLI sends "4" for 4 and "true" for True)."""
    if value is None:
        return None
    if isinstance(like, bool):
        return value in (True, 1, "true", "True", "1")
    if isinstance(like, int | float):
        return float(value)
    return str(value)


def _matches(actual: Any, op: str, want: Any) -> bool:
    if op in ("in", "notin"):
        if not isinstance(want, list):
            raise ValueError(f"{op} needs a list")
        found = any(actual == _coerce(w, actual) for w in want)
        return found if op == "in" else not found
    if actual is None:
        return op == "neq" and want is not None
    target = _coerce(want, actual)
    if op == "eq":
        return actual == target
    if op == "neq":
        return actual != target
    if target is None:
        return False
    if isinstance(actual, bool | str):
        actual, target = float(actual), float(target)  # only numbers are ordered
    return {"gt": actual > target, "gte": actual >= target, "lt": actual < target, "lte": actual <= target}[op]


def apply_filters(rows: list[dict[str, Any]], query: dict[str, Any], known: set[str]) -> list[dict[str, Any]]:
    """Rows matching every ``{field: {op: value}}`` of the query; ValueError names a bad field or operator."""
    conds: list[tuple[str, str, Any]] = []
    for name, spec in query.items():
        if name in QUERY_META:
            continue
        if name not in known:
            raise ValueError(f"unknown field {name!r}")
        if not isinstance(spec, dict):
            raise ValueError(f"{name}: expected {{op: value}}")
        for op, want in spec.items():
            if op not in OPERATORS:
                raise ValueError(f"{name}: unknown operator {op!r}")
            conds.append((name, op, want))
    out = []
    for row in rows:
        ok = True
        for name, op, want in conds:
            actual = _country(row.get(name)) if name == "geolocation" else row.get(name)
            if not _matches(actual, op, want):
                ok = False
                break
        if ok:
            out.append(row)
    return out


def apply_order(rows: list[dict[str, Any]], order: list[Any]) -> list[dict[str, Any]]:
    for name, direction in reversed([(o[0], o[1] if len(o) > 1 else "asc") for o in order]):
        present = [r for r in rows if r.get(name) is not None]
        absent = [r for r in rows if r.get(name) is None]
        present.sort(key=operator.itemgetter(name), reverse=direction == "desc")
        rows = present + absent
    return rows


def priced(offer: dict[str, Any], storage_gib: float, bid: bool) -> dict[str, Any]:
    """An offer as a search answers it: dph_total includes storage for ``allocated_storage``."""
    out = copy.deepcopy(offer)
    storage_h = offer["storage_cost"] * storage_gib / HOURS_PER_MONTH
    out["storage_total_cost"] = round(storage_h, 6)
    out["dph_total"] = round(offer["dph_base"] + storage_h, 6)
    out["dlperf_per_dphtotal"] = round(offer["dlperf"] / out["dph_total"], 4)
    out["flops_per_dphtotal"] = round(offer["total_flops"] / out["dph_total"], 4)
    out["score"] = round(out["dlperf_per_dphtotal"] * offer["reliability"], 4)
    out["is_bid"] = bid
    return out


# --------------------------------------------------------------------------- HTTP


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON answer with ``Content-Type: application/json`` exactly, as the real service sends it (aiohttp's
    own adds ``; charset=utf-8``, which Vast's CLI refuses: "invalid return Content-Type")."""
    return web.Response(body=json.dumps(data).encode(), status=status, headers=headers,
                        content_type="application/json")


def _error(status: int, error: str, msg: str, headers: dict[str, str] | None = None) -> web.Response:
    return _json({"success": False, "error": error, "msg": msg}, status=status, headers=headers)


STATE: web.AppKey[VastState] = web.AppKey("vast_state", VastState)
BODY: web.RequestKey[Any] = web.RequestKey("vast_body", object)


@web.middleware
async def _gate(request: web.Request, handler: Any) -> web.StreamResponse:
    """Log every /api/ call, enforce the key and inject the configured faults."""
    if not request.path.startswith("/api/"):
        return await handler(request)
    state = request.app[STATE]
    body: Any = None
    if request.can_read_body:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return _error(400, "invalid_args", "body is not JSON")
    request[BODY] = body
    state.requests.append({"method": request.method, "path": request.path, "query": dict(request.query),
                           "body": body, "at": time.time()})
    f = state.faults
    auth = request.headers.get("Authorization", "")
    if f.unauthorized or auth != f"Bearer {state.api_key}":
        return _error(401, "invalid_user_key", "Invalid user key")
    if f.quota_exhausted and request.path in ("/api/v0/bundles/", "/api/v0/search/asks/"):
        return _error(429, "daily_search_quota", "daily search quota exceeded; it resets at 00:00 UTC")
    route = request.match_info.route.resource
    if state.limited(route.canonical if route is not None else request.path):
        return _error(429, "too_many_requests", "API requests too frequent")  # Vast sends no Retry-After
    retry_after = {"Retry-After": f"{f.retry_after_s:g}"}
    if f.burst_429 > 0:
        f.burst_429 -= 1
        return _error(429, "too_many_requests", "API requests too frequent", retry_after)
    if f.error_rate and state._fault_rng.random() < f.error_rate:
        if state._fault_rng.random() < 0.5:
            return _error(429, "too_many_requests", "API requests too frequent", retry_after)
        return _error(500, "server_error", "internal error")
    return await handler(request)


async def _search(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = request[BODY]
    query = body.get("q") if request.method == "PUT" and isinstance(body, dict) else body
    if not isinstance(query, dict):
        return _error(400, "invalid_args", "the query must be a JSON object")
    kind = query.get("type", "on-demand")
    if kind not in ("on-demand", "bid", "reserved"):
        return _error(400, "invalid_args", f"unknown type {kind!r}")
    try:
        storage = float(query.get("allocated_storage", DEFAULT_STORAGE_GIB))
        limit = int(query.get("limit") or DEFAULT_SEARCH_LIMIT)
        rows = [priced(o, storage, kind == "bid") for oid, o in state.offers.items() if oid not in state.rented]
        if kind == "bid":
            rows = [r for r in rows if r["min_bid"] is not None]
        known = set(rows[0]) if rows else set()
        known |= EXTRA_QUERY_FIELDS | set(next(iter(state.offers.values()), {}))
        rows = apply_filters(rows, query, known)
        order = query.get("order") or [["score", "desc"]]
        for o in order:
            if o[0] not in known:
                raise ValueError(f"unknown order field {o[0]!r}")
        rows = apply_order(rows, order)
    except (ValueError, TypeError, IndexError) as exc:
        return _error(400, "invalid_args", str(exc))
    rows = rows[:limit]
    if state.faults.numbers_as_strings:
        rows = [{k: str(v) if k in STRINGY and v is not None else v for k, v in r.items()} for r in rows]
    return _json({"offers": rows})


async def _create(request: web.Request) -> web.Response:
    state = request.app[STATE]
    ask_id = int(request.match_info["ask_id"])
    body = request[BODY] or {}
    if state.faults.slow_create_s:
        await asyncio.sleep(state.faults.slow_create_s)
    offer = state.offers.get(ask_id)
    if offer is not None and ask_id not in state.rented and state.faults.steal_next_create > 0:
        state.faults.steal_next_create -= 1
        state.rent_by_other(ask_id)
    state.creates_seen += 1
    if offer is not None and ask_id not in state.rented and state.creates_seen == state.faults.steal_create_number:
        state.rent_by_other(ask_id)
    if offer is None or ask_id in state.rented:
        return _error(410, "no_such_ask", f"Instance type by id {ask_id} is not available.")
    if not body.get("image"):
        return _error(400, "invalid_args", "image is required")
    price = body.get("price")
    if price is not None:
        if offer["min_bid"] is None:
            return _error(400, "invalid_args", "this offer does not take bids")
        if float(price) < offer["min_bid"]:
            return _error(400, "bid_too_low", f"bid below the minimum {offer['min_bid']}")
    disk = float(body.get("disk") or 10.0)
    if disk > offer["disk_space"]:
        return _error(400, "insufficient_disk", "the machine has less disk than asked")
    iid = state.next_instance
    state.next_instance += 1
    p = priced(offer, disk, price is not None)
    state.rented[ask_id] = iid
    state.instances[iid] = {
        "id": iid, "ask_id": ask_id, "machine_id": offer["machine_id"], "host_id": offer["host_id"],
        "actual_status": None, "cur_state": "running", "next_state": "running", "intended_status": "running",
        "image_uuid": body["image"], "image_args": body.get("args") or [], "image_runtype": body.get("runtype"),
        "label": body.get("label"), "onstart": body.get("onstart"), "_entrypoint": body.get("entrypoint"),
        "extra_env": list((body.get("env") or {}).items()),
        "num_gpus": offer["num_gpus"], "gpu_name": offer["gpu_name"], "gpu_ram": offer["gpu_ram"],
        "gpu_util": None, "gpu_arch": "nvidia", "gpu_temp": None, "cuda_max_good": offer["cuda_max_good"],
        "driver_version": offer["driver_version"], "cpu_cores_effective": offer["cpu_cores_effective"],
        "cpu_util": None, "cpu_ram": offer["cpu_ram"], "disk_space": disk, "disk_util": 0.0,
        "inet_up": offer["inet_up"], "inet_down": offer["inet_down"], "public_ipaddr": offer["public_ipaddr"],
        "ssh_host": f"ssh{iid % 9}.vast.example", "ssh_port": 20000 + iid % 10000, "ssh_idx": str(iid % 9),
        "status_msg": "", "uptime_mins": None, "start_date": time.time(), "end_date": offer["end_date"],
        "dph_total": price if price is not None else p["dph_total"], "dph_base": offer["dph_base"],
        "_bid": price is not None, "geolocation": offer["geolocation"],
        "reliability2": offer["reliability2"], "template_id": None, "template_hash_id": None, "ports": {},
    }
    if state.faults.lose_next_create > 0:
        state.faults.lose_next_create -= 1
        return _error(502, "bad_gateway", "upstream timed out")
    if state.faults.slow_create_answer_s:
        await asyncio.sleep(state.faults.slow_create_answer_s)
    return _json({"success": True, "new_contract": iid})


def _public(inst: dict[str, Any]) -> dict[str, Any]:
    """An instance row as the API shows it (without what only this server keeps)."""
    return {k: v for k, v in inst.items() if k != "ask_id" and not k.startswith("_")}


async def _list_instances(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        filters = json.loads(request.query.get("select_filters", "{}"))
        order_by = json.loads(request.query.get("order_by", '[{"col": "id", "dir": "asc"}]'))
        limit = int(request.query.get("limit", "25"))
        if not 1 <= limit <= LIST_LIMIT_MAX:
            return _error(400, "invalid_args", f"limit must be between 1 and {LIST_LIMIT_MAX}")
        token = request.query.get("after_token")
        after = int(base64.urlsafe_b64decode(token.encode()).decode()) if token else None
        for inst in state.instances.values():
            state.look(inst)
        rows = [_public(i) for i in state.instances.values()]
        known = set(rows[0]) if rows else {"id", "label"}
        rows = apply_filters(rows, filters, known)
        rows = apply_order(rows, [[o["col"], o.get("dir", "asc")] for o in order_by] + [["id", "asc"]])
    except (ValueError, TypeError, KeyError) as exc:
        return _error(400, "invalid_args", str(exc))
    total = len(rows)
    if after is not None:
        ids = [r["id"] for r in rows]
        rows = rows[ids.index(after) + 1:] if after in ids else [r for r in rows if r["id"] > after]
    page = rows[:limit]
    next_token = None
    if len(rows) > limit:
        next_token = base64.urlsafe_b64encode(str(page[-1]["id"]).encode()).decode()
    labels: dict[str, int] = {}
    for inst in state.instances.values():
        if inst.get("label"):
            labels[inst["label"]] = labels.get(inst["label"], 0) + 1
    return _json({"instances": page, "next_token": next_token, "total_instances": total,
                              "label_counts": labels})


async def _show_instance(request: web.Request) -> web.Response:
    state = request.app[STATE]
    inst = state.instances.get(int(request.match_info["instance_id"]))
    if inst is None:
        return _error(404, "no_such_instance", "Instance not found.")
    state.look(inst)
    return _json({"instances": _public(inst)})


async def _destroy(request: web.Request) -> web.Response:
    if request.app[STATE].destroy(int(request.match_info["instance_id"])) is None:
        return _error(404, "no_such_instance", "Instance not found.")
    return _json({"success": True})


def _tail(text: str, body: dict[str, Any]) -> str:
    """``filter`` (a grep: lines containing it) and ``tail`` (the last N lines), as the real endpoint applies."""
    lines = text.splitlines(keepends=True)
    if body.get("filter"):
        lines = [ln for ln in lines if str(body["filter"]) in ln]
    tail = body.get("tail")
    if tail not in (None, ""):
        n = int(tail)
        lines = lines[-n:] if n > 0 else []
    return "".join(lines)


async def _request_logs(request: web.Request) -> web.Response:
    """Upload the instance's log (container or daemon) to a URL of its own, as Vast does to S3."""
    state = request.app[STATE]
    iid = int(request.match_info["instance_id"])
    inst = state.instances.get(iid)
    if inst is None:
        return _error(404, "invalid_id", "Invalid instance id.")
    body = request[BODY] if isinstance(request[BODY], dict) else {}
    try:
        state.refresh(inst)
        if str(body.get("daemon_logs", "")).lower() == "true":
            text = "".join(line + "\n" for line in state.daemon_logs.get(iid, []))
        else:
            text = state.container_log(iid)
        text = _tail(text, body)
    except (TypeError, ValueError):
        return _error(400, "invalid_args", "tail must be a number of lines")
    token = secrets.token_hex(16)
    state.log_uploads[token] = {"instance_id": iid, "text": text, "gets": 0}
    url = f"{request.scheme}://{request.host}/_s3/instance_logs/{token}.log"
    return _json({"success": True, "result_url": url, "msg": "Logs will be uploaded to the result url"})


async def _uploaded_log(request: web.Request) -> web.Response:
    """The uploaded log (no key: a public object). Not there yet on the first GET, as on S3 right after the PUT."""
    upload = request.app[STATE].log_uploads.get(request.match_info["token"])
    if upload is None:
        return web.Response(status=404, content_type="application/xml",
                            text="<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message>"
                                 "</Error>")
    upload["gets"] += 1
    upload["keyed"] = upload.get("keyed", False) or "Authorization" in request.headers  # a key sent to S3: a leak
    if upload["gets"] == 1:
        return web.Response(status=403, content_type="application/xml",
                            text="<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>")
    return web.Response(text=upload["text"], content_type="text/plain", charset="utf-8")


async def _admin_reset(request: web.Request) -> web.Response:
    request.app[STATE].reset()
    return _json({"success": True})


async def _admin_faults(request: web.Request) -> web.Response:
    data = await request.json()
    request.app[STATE].set_faults(Faults(**data))
    return _json({"success": True})


async def _admin_requests(request: web.Request) -> web.Response:
    return _json({"requests": request.app[STATE].requests})


async def _admin_steal(request: web.Request) -> web.Response:
    request.app[STATE].rent_by_other(int(request.match_info["ask_id"]))
    return _json({"success": True})


def make_app(state: VastState) -> web.Application:
    app = web.Application(middlewares=[_gate])
    app[STATE] = state
    app.router.add_post("/api/v0/bundles/", _search)
    app.router.add_put("/api/v0/search/asks/", _search)
    app.router.add_put("/api/v0/asks/{ask_id:\\d+}/", _create)
    app.router.add_get("/api/v1/instances/", _list_instances)
    app.router.add_get("/api/v0/instances/{instance_id:\\d+}/", _show_instance)
    app.router.add_delete("/api/v0/instances/{instance_id:\\d+}/", _destroy)
    app.router.add_put("/api/v0/instances/request_logs/{instance_id:\\d+}/", _request_logs)
    app.router.add_get("/_s3/instance_logs/{token:[0-9a-f]+}.log", _uploaded_log)
    app.router.add_post("/_admin/reset", _admin_reset)
    app.router.add_post("/_admin/faults", _admin_faults)
    app.router.add_get("/_admin/requests", _admin_requests)
    app.router.add_post("/_admin/asks/{ask_id:\\d+}/steal", _admin_steal)
    return app


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class VastApiServer:
    """The app on a loopback port, started and stopped from a running event loop."""

    def __init__(self, api_key: str, *, host: str = "127.0.0.1", port: int = 0, seed: int = 7,
                 count: int = 400, anchors: dict[str, float] | None = None) -> None:
        self.state = VastState(api_key=api_key, seed=seed, count=count, anchors=anchors)
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> VastApiServer:
        if not self.port:
            self.port = free_port(self.host)
        self._runner = web.AppRunner(make_app(self.state), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.state.stop_containers()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A local Vast.ai API (loopback only) for Lockstep's tests")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--api-key", required=True, help="the key clients must send as 'Authorization: Bearer'")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--count", type=int, default=400, help="offers in the market")
    parser.add_argument("--catalog", help="a SkyPilot Vast catalog CSV to anchor prices on")
    args = parser.parse_args(argv)
    anchors = catalog_anchors(args.catalog) if args.catalog else None
    server = VastApiServer(args.api_key, host=args.host, port=args.port, seed=args.seed, count=args.count,
                           anchors=anchors)

    async def serve() -> None:
        await server.start()
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # stop cleanly: no container outlives the server
            loop.add_signal_handler(sig, done.set)
        print(f"Vast API on {server.url} ({args.count} offers, seed {args.seed})", flush=True)
        try:
            await done.wait()
        finally:
            await server.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
