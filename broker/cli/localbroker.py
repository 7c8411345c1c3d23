"""The per-user background broker: found, started or restarted for the local commands (no ``--server``).

Without a server nothing would follow a job between two commands: a Vast instance whose command has ended
would bill until someone ran ``lockstep status``. So the first local command that needs the broker
(``submit``, ``jobs``, ``status``, ``cancel``, ``logs``) starts one in the background: ``lockstep server
run``, the same application and loops as ``lockstep serve``, on a free loopback port with a bearer token it
makes for itself, detached from the terminal (its own session; output to its log file). The commands then
talk to it through the SDK (broker/sdk.py) like to any server, so the store has one writer.

One broker per store: its files live in ``<user data dir>/lockstep/brokers/<hash of the store URL>/``
(``LOCKSTEP_BROKER_HOME`` moves the whole tree, for tests):

- ``state.json`` (mode 0600): pid, URL, token, the store (password masked), a fingerprint of the settings
  it runs with, when it started. Written by the broker once it listens.
- ``run.lock``: held (flock) by the running broker for its whole life, so "is it up" is a lock test that a
  killed process (even by SIGKILL) can never answer wrongly, and a reused pid cannot fool.
- ``start.lock``: held by whoever is starting one, so two commands at once start one broker, not two.
- ``broker.log``: what it logs (``lockstep server logs``).

A broker whose settings differ from the command's (the configuration changed) is stopped and started
again: jobs are in the store, and its reconciliation takes over what the old one left.

``quote``, ``offers`` and ``gpus`` use a broker that is already up (fast: no offer book in the command's
process) but never start one: they need no writer.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.errors import LockstepError

if TYPE_CHECKING:
    from broker.config import Settings

HOME_ENV = "LOCKSTEP_BROKER_HOME"
START_TIMEOUT_S = 90.0  # reconciliation with slow markets can take a while on a first start
STOP_TIMEOUT_S = 30.0
# Environment that changes what the command line does, not what the broker is: not in the inputs' print.
_NOT_INPUTS = frozenset({"LOCKSTEP_SERVER", "LOCKSTEP_TOKEN", "LOCKSTEP_DEBUG", "LOCKSTEP_LOG_FORMAT",
                         HOME_ENV})


class BrokerUnavailable(LockstepError):
    """The background broker could not be started or reached: nothing was submitted."""


def home() -> Path:
    explicit = os.environ.get(HOME_ENV)
    if explicit:
        return Path(explicit).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("lockstep", appauthor=False)) / "brokers"


def db_url_from(value: str) -> str:
    """--db accepts a URL or a plain file path (SQLite)."""
    return value if "://" in value else f"sqlite:///{os.path.abspath(value)}"


def broker_dir(db_url: str) -> Path:
    return home() / hashlib.sha256(db_url.encode()).hexdigest()[:16]


def inputs_print(config_file: str | None, db: str | None) -> str:
    """A cheap print of what the settings are made from (the configuration file's bytes, the LOCKSTEP_
    environment, ``--db``): the same print, the same settings, without loading them."""
    h = hashlib.sha256()
    if config_file:
        h.update(os.path.abspath(config_file).encode() + b"\0")
        with contextlib.suppress(OSError):
            h.update(Path(config_file).read_bytes())
    h.update(b"\0" + (db or "").encode() + b"\0" + os.getcwd().encode() + b"\0")
    for k in sorted(os.environ):
        if k.upper().startswith("LOCKSTEP_") and k.upper() not in _NOT_INPUTS:
            h.update(f"{k}={os.environ[k]}\0".encode())
    return h.hexdigest()[:24]


def settings_print(settings: Settings) -> str:
    # The secrets' values count too (a changed key must restart the broker), but only as part of a hash.
    secrets = "\0".join(settings.secret_values())
    return hashlib.sha256((settings.model_dump_json() + "\0" + secrets).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class BrokerInfo:
    dir: Path
    pid: int
    url: str
    token: str
    settings_print: str
    store: str
    started_at: str

    def __repr__(self) -> str:  # never the token
        return f"BrokerInfo(pid={self.pid}, url={self.url!r})"


# --------------------------------------------------------------------------- files


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_private(path: Path, data: dict[str, Any]) -> None:
    """``data`` as JSON at ``path``, readable by this user only, replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def is_running(d: Path) -> bool:
    """Whether a broker holds ``d``'s run lock (a dead one never does, however it died)."""
    try:
        fd = os.open(d / "run.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def hold_run_lock(d: Path) -> int:
    """Take ``d``'s run lock for this process's life (the broker does, first thing); BrokerUnavailable when
    another broker has it."""
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(d / "run.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise BrokerUnavailable(f"another background broker already runs for this store ({d})") from None
    return fd


@contextlib.contextmanager
def _start_lock(d: Path) -> Iterator[None]:
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(d / "start.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another command starting it: wait for it, then use that one
        yield
    finally:
        os.close(fd)


def running(d: Path) -> BrokerInfo | None:
    """The broker up for directory ``d`` (listening, its state written), or None."""
    if not is_running(d):
        return None
    s = _read_json(d / "state.json")
    if not s or not s.get("url") or not s.get("token"):
        return None  # holding the lock but not listening yet
    return BrokerInfo(d, int(s["pid"]), str(s["url"]), str(s["token"]), str(s.get("settings_print", "")),
                      str(s.get("store", "")), str(s.get("started_at", "")))


def quick(config_file: str | None, db: str | None) -> BrokerInfo | None:
    """The broker a previous command found for exactly these inputs, if it is still up: no settings loaded."""
    entry = _read_json(home() / "inputs" / f"{inputs_print(config_file, db)}.json")
    if not entry or "dir" not in entry:
        return None
    info = running(home() / str(entry["dir"]))
    if info is None or info.settings_print != entry.get("settings_print"):
        return None
    return info


def _remember(config_file: str | None, db: str | None, info: BrokerInfo) -> None:
    with contextlib.suppress(OSError):
        write_private(home() / "inputs" / f"{inputs_print(config_file, db)}.json",
                      {"dir": info.dir.name, "settings_print": info.settings_print})


# --------------------------------------------------------------------------- start, stop


def find(settings: Settings, config_file: str | None, db: str | None) -> BrokerInfo | None:
    """The broker up for these settings' store, if it runs with these very settings."""
    info = running(broker_dir(settings.db_url))
    if info is None or info.settings_print != settings_print(settings):
        return None
    _remember(config_file, db, info)
    return info


def ensure(settings: Settings, config_file: str | None, db: str | None, *,
           timeout_s: float = START_TIMEOUT_S) -> BrokerInfo:
    """The broker for these settings' store: the one up, or a new one (a stale one restarted first)."""
    d = broker_dir(settings.db_url)
    want = settings_print(settings)
    info = running(d)
    if info is not None and info.settings_print == want:
        _remember(config_file, db, info)
        return info
    with _start_lock(d):
        info = running(d)
        if info is not None and info.settings_print == want:
            _remember(config_file, db, info)
            return info
        if is_running(d):
            note("the background broker's settings changed: restarting it (jobs carry on)")
            stop(d, timeout_s=STOP_TIMEOUT_S)
        info = _spawn(d, config_file, db, timeout_s)
    _remember(config_file, db, info)
    return info


def note(line: str) -> None:
    print(f"lockstep: {line}", file=sys.stderr, flush=True)


def _spawn(d: Path, config_file: str | None, db: str | None, timeout_s: float) -> BrokerInfo:
    args = [sys.executable, "-m", "broker"]
    if config_file:
        args += ["--config", os.path.abspath(config_file)]
    if db:
        args += ["--db", db]
    args += ["server", "run"]
    log_path = d / "broker.log"
    old = _read_json(d / "state.json") or {}
    with open(log_path, "ab") as log:
        os.chmod(log_path, 0o600)
        # Its own session: no terminal, no SIGHUP when the terminal closes, no Ctrl-C from this command's group.
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            raise BrokerUnavailable(f"the background broker could not start (exit {code}): "
                                    f"{last_line(log_path) or 'no output'} — nothing was submitted; "
                                    f"see {log_path}")
        s = _read_json(d / "state.json")
        if s and s.get("pid") == proc.pid and s.get("url") and s != old:
            info = running(d)
            if info is not None:
                return info
        time.sleep(0.05)
    raise BrokerUnavailable(f"the background broker did not start within {timeout_s:g}s "
                            f"(pid {proc.pid}, still starting?): nothing was submitted; see {log_path}")


def last_line(path: Path) -> str:
    """The last line of a log that says something (the error a failed start ended with)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for ln in reversed(lines):
        if ln.strip():
            return ln.strip()
    return ""


def stop(d: Path, *, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Ask the broker of ``d`` to stop (SIGTERM: requests finished, loops stopped) and wait for it to end;
    SIGKILL if it has not ended in ``timeout_s``. False when none was running."""
    if not is_running(d):
        return False
    s = _read_json(d / "state.json") or {}
    pid = int(s.get("pid") or 0)
    if pid <= 0:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while is_running(d):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
        time.sleep(0.05)
    return True
