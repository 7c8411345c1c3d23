#!/usr/bin/env python3
"""lockstep-run: the in-job wrapper, the same on every market.

Shipped inside a job's launch payload and run on each node of the job (on the
host on AWS, inside the container on Vast, under ``srun`` on Slurm). Python 3.6+
standard library only, one file, no broker credentials: everything it needs is
in its *manifest* (a JSON document made by the broker at launch).

What it does, in order:

1. installs its signal handlers (TERM, INT, HUP, USR1, USR2) before anything else;
2. works out where it stands in the job (rendezvous): its node rank, the node
   count, every node's address, the head node's address; exported as
   ``LOCKSTEP_*`` variables (docs/runtime.md lists them) so ``torchrun`` can
   start one job across the nodes;
3. unpacks the job's files into its working directory and fetches its data URL
   (to disk, in chunks);
4. runs the command (under ``bash -o pipefail`` where bash exists, in a
   container when the manifest says so) with the job's environment and secrets,
   each output line time-stamped, secret values masked (multi-line ones too),
   written to a log file (and to its own stdout);
5. ships the log to where the broker reads it (numbered parts of bounded size
   to presigned URLs, or a shared directory) while the command runs, and a
   heartbeat, so the broker notices a wrapper that went silent;
6. enforces ``max_duration`` and passes the signals it receives on to the
   command's whole process tree (its process group, and descendants that left
   it: the wrapper is their subreaper); a stop is TERM, then KILL of everything
   left ``grace_s`` after the TERM;
7. records the exit status (``status.json``, and a last
   ``LOCKSTEP-EXIT <nonce> {...}`` line on stdout for markets whose logs API is
   the only way out);
8. ends the machine's billing when asked to (``shutdown`` in the manifest),
   retrying and falling back (``shutdown_fallbacks``, sysrq) when it fails;
9. exits with the command's exit code.

Steps 7 and 8 run in a ``finally`` that every failure of steps 2-6 reaches;
every write of output is guarded, so a full disk, a closed stdout or an
encoding error never stops the command (docs/runtime.md, "What the wrapper
guarantees").

Usage: ``python3 wrapper.py MANIFEST.json`` (``-`` reads stdin), or with the
manifest base64-encoded (gzip allowed) in ``LOCKSTEP_MANIFEST``, or fetched from
the URL in ``LOCKSTEP_MANIFEST_URL``.

Written for Python 3.6: no ``from __future__ import annotations``, no walrus,
no ``shlex.join``, no ``capture_output`` (tests/runtime/test_compat.py checks).
"""

import signal

# The first thing a node's wrapper does: note the stopping signals (a preemption can come while the rest of this
# file is still being read); Job.install takes over and acts on what was noted. Not when the broker imports it.
EARLY_SIGNALS = []  # type: list
if __name__ == "__main__":
    for _name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"):
        if hasattr(signal, _name):
            signal.signal(getattr(signal, _name), lambda signum, _frame: EARLY_SIGNALS.append(signum))

import base64  # noqa: E402 - after the handlers, on purpose
import collections  # noqa: E402
import datetime  # noqa: E402
import errno  # noqa: E402
import gzip  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tarfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Dict, List, Optional  # noqa: E402

EXIT_MARKER = "LOCKSTEP-EXIT "
BEAT_MARKER = "LOCKSTEP-BEAT "
MASK = "*****"
MIN_SECRET_LEN = 4  # shorter values would mask ordinary words
DEFAULT_RDZV_PORT = 29500
WRAPPER_FAILED = 127  # the exit code when the wrapper itself could not start the command
MAX_LINE_BYTES = 64 * 1024  # a longer line is cut into pieces of this size (a 100 MB line must not be 100 MB of RAM)
READ_CHUNK = 64 * 1024
TAIL_LINES = 20  # kept for the status
TAIL_LINE_CHARS = 1000  # each, in the status
MEMORY_TAIL_BYTES = 1 << 20  # what is kept in memory once the log file cannot be written
DEFAULT_PART_BYTES = 1 << 20  # a log part shipped to one presigned URL
DEFAULT_HEARTBEAT_S = 30.0
END_UPLOAD_BUDGET_S = 60.0  # the status and the last log part, at most this long before the shutdown
SHUTDOWN_ATTEMPTS = 3
SHUTDOWN_TIMEOUT_S = 60.0
SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
STOPPING = ("SIGTERM", "SIGINT", "SIGHUP")  # the rest are passed on only (a workload's "checkpoint now")
PR_SET_CHILD_SUBREAPER = 36
END_MARK_VAR = "LOCKSTEP_END_MARK"  # a file the boot script reads: "status" once written, "shutdown" once run
NONCE_VAR = "LOCKSTEP_EXIT_NONCE"  # the exit line's nonce, for a boot script (never passed to the command)


class WrapperError(Exception):
    """The wrapper cannot start the command; reported as the job's failure, with this message."""


def log_time() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def note(text: str) -> None:
    """A line about the wrapper itself on stderr; never raises (stderr may be closed)."""
    try:
        sys.stderr.write("lockstep-run: " + text + "\n")
        sys.stderr.flush()
    except Exception:
        pass


# --------------------------------------------------------------------------- fault injection (tests)


class Faults:
    """Failures injected at the wrapper's I/O points, for tests/runtime/test_faults.py.

    ``LOCKSTEP_TEST_FAULTS`` is JSON ``{"point": [n, ...]}``: the n-th call (from 0) at that point raises
    ``OSError(EIO)``. Empty in production: :meth:`check` is then one dictionary lookup.
    """

    def __init__(self, spec: str) -> None:
        self.plan = {}  # type: Dict[str, set]
        self.calls = collections.Counter()  # type: collections.Counter
        self.lock = threading.Lock()
        if spec:
            try:
                self.plan = {str(k): set(int(n) for n in v) for k, v in json.loads(spec).items()}
            except (ValueError, TypeError, AttributeError):
                note("LOCKSTEP_TEST_FAULTS ignored: not a JSON mapping of lists")

    def check(self, point: str) -> None:
        if not self.plan:
            return
        with self.lock:
            n = self.calls[point]
            self.calls[point] += 1
        if n in self.plan.get(point, ()):
            raise OSError(errno.EIO, "injected failure at " + point)


FAULTS = Faults(os.environ.get("LOCKSTEP_TEST_FAULTS", ""))


# --------------------------------------------------------------------------- transport


def http(method: str, url: str, data: Optional[bytes] = None, headers: Optional[dict] = None,
         timeout: float = 30.0, attempts: int = 5, deadline: Optional[float] = None, sink: Any = None) -> bytes:
    """One HTTP request with bounded, growing retries on network errors and 5xx/429. Raises on the rest.

    ``deadline`` (``time.monotonic``) bounds the whole call, retries included; ``sink`` (a binary file)
    receives the body in chunks instead of memory (it is rewound on a retry).
    """
    import urllib.error
    import urllib.request  # here: the broker imports this module's constants, and `lockstep quote` sends nothing

    delay = 1.0
    for attempt in range(attempts):
        left = timeout if deadline is None else min(timeout, deadline - time.monotonic())
        if left <= 0:
            raise OSError(errno.ETIMEDOUT, "out of time for " + method)
        req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        try:
            FAULTS.check("http")
            with urllib.request.urlopen(req, timeout=left) as resp:
                if sink is None:
                    return resp.read()
                sink.seek(0)
                sink.truncate()
                while True:
                    chunk = resp.read(READ_CHUNK)
                    if not chunk:
                        return b""
                    sink.write(chunk)
        except urllib.error.HTTPError as exc:
            if (exc.code < 500 and exc.code != 429) or attempt == attempts - 1:
                raise
        except Exception:  # URLError, OSError, http.client.HTTPException (a malformed answer), timeouts
            if attempt == attempts - 1:
                raise
        pause = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)
        delay = min(delay * 2, 30.0)
    raise RuntimeError("unreachable")


def put(url: str, body: bytes, content_type: str = "application/octet-stream", **kw: Any) -> None:
    http("PUT", url, body, {"Content-Type": content_type}, **kw)


def decode_blob(text: str) -> bytes:
    raw = base64.b64decode(text)
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def load_manifest(argv: List[str], environ: dict) -> dict:
    if len(argv) > 1:
        if argv[1] == "-":
            return json.load(sys.stdin)
        with open(argv[1], encoding="utf-8") as fh:
            return json.load(fh)
    if environ.get("LOCKSTEP_MANIFEST"):
        return json.loads(decode_blob(environ["LOCKSTEP_MANIFEST"]).decode("utf-8"))
    if environ.get("LOCKSTEP_MANIFEST_URL"):
        return json.loads(http("GET", environ["LOCKSTEP_MANIFEST_URL"]).decode("utf-8"))
    raise WrapperError("lockstep-run: no manifest (give a file, LOCKSTEP_MANIFEST or LOCKSTEP_MANIFEST_URL)")


# --------------------------------------------------------------------------- rendezvous


def imds(base: str, path: str) -> str:
    """One EC2 instance metadata value (IMDSv2: a session token first)."""
    token = http("PUT", base + "/latest/api/token", b"", {"X-aws-ec2-metadata-token-ttl-seconds": "300"},
                 timeout=5).decode()
    return http("GET", base + "/latest/meta-data/" + path, None, {"X-aws-ec2-metadata-token": token},
                timeout=5).decode().strip()


def own_identity(rdzv: dict, environ: dict) -> str:
    """This node's id as the peer list names it."""
    if environ.get("LOCKSTEP_NODE_ID"):
        return environ["LOCKSTEP_NODE_ID"]
    if rdzv.get("identity") == "imds":
        return imds(environ.get("LOCKSTEP_IMDS_URL", "http://169.254.169.254"), "instance-id")
    return socket.gethostname()


def peer_list(doc: Any) -> List[Dict[str, str]]:
    """The peer list's nodes, each with an ``id`` and an ``addr``; ValueError for anything else."""
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list) or not nodes:
        raise ValueError("the peer list has no nodes")
    out = []
    for node in nodes:
        if not isinstance(node, dict) or not node.get("id") or not node.get("addr"):
            raise ValueError("a peer list entry without id or addr: %r" % (node,))
        out.append({"id": str(node["id"]), "addr": str(node["addr"])})
    return out


def wait_for_peers(rdzv: dict, deadline: float, stopped: Callable[[], bool]) -> List[Dict[str, str]]:
    """The peer list the broker publishes once it knows every node's address."""
    last = ""
    while True:
        try:
            if rdzv.get("peers_url"):
                doc = json.loads(http("GET", rdzv["peers_url"], attempts=1, timeout=10).decode("utf-8"))
            else:
                with open(rdzv["peers_file"], encoding="utf-8") as fh:
                    doc = json.load(fh)
            return peer_list(doc)
        except Exception as exc:  # not there yet, a malformed answer, a bad document: try again until the deadline
            last = "%s: %s" % (type(exc).__name__, exc)
        for _ in range(10):  # 2 s between tries, in steps: a signal is answered within 0.2 s
            if stopped():
                raise WrapperError("lockstep-run: stopped by a signal while waiting for the peer list")
            if time.time() > deadline:
                raise WrapperError("lockstep-run: the peer list did not arrive in time (last: %s)" % last[:200])
            time.sleep(0.2)


def rendezvous(manifest: dict, environ: dict, stopped: Callable[[], bool] = lambda: False) -> Dict[str, str]:
    """The ``LOCKSTEP_*`` rendezvous variables for this node."""
    rdzv = manifest.get("rendezvous") or {}
    mode = rdzv.get("mode", "single")
    port = int(rdzv.get("port") or DEFAULT_RDZV_PORT)
    gpus = int(rdzv.get("gpus_per_node") or 0)
    if mode == "peers":
        peers = wait_for_peers(rdzv, time.time() + float(rdzv.get("wait_s", 900)), stopped)
        me = own_identity(rdzv, environ)
        ids = [p["id"] for p in peers]
        if me not in ids:
            raise WrapperError("lockstep-run: this node (%s) is not in the job's peer list" % me)
        rank = ids.index(me)
        addrs = [p["addr"] for p in peers]
    elif mode == "env":
        # Slurm: the batch step exports the node addresses; each srun task knows its node's index.
        addrs = [a for a in environ.get("LOCKSTEP_NODE_ADDRS", "").split(",") if a]
        rank = int(environ.get("LOCKSTEP_NODE_RANK") or environ.get("SLURM_NODEID") or 0)
        if not addrs:
            addrs = ["127.0.0.1"]
    else:
        addrs = [str(rdzv.get("addr") or "127.0.0.1")]
        rank = 0
    return {
        "LOCKSTEP_NODE_RANK": str(rank),
        "LOCKSTEP_NUM_NODES": str(len(addrs)),
        "LOCKSTEP_GPUS_PER_NODE": str(gpus),
        "LOCKSTEP_HEAD_ADDR": addrs[0],
        "LOCKSTEP_NODE_ADDRS": ",".join(addrs),
        "LOCKSTEP_RDZV_PORT": str(port),
        # What torch.distributed's env:// initialisation reads, for workloads that use it directly.
        "MASTER_ADDR": addrs[0],
        "MASTER_PORT": str(port),
    }


def rank_hint(environ: dict) -> int:
    """This node's rank before the rendezvous (for a failure that comes before it): Slurm's, else 0."""
    try:
        return int(environ.get("LOCKSTEP_NODE_RANK") or environ.get("SLURM_NODEID") or 0)
    except ValueError:
        return 0


# --------------------------------------------------------------------------- files and data


def _inside(base: str, name: str) -> bool:
    target = os.path.realpath(os.path.join(base, name))
    return target == base or target.startswith(base + os.sep)


def unpack_files(blob: str, workdir: str) -> int:
    """Extract the job's files (a base64 tar.gz) into ``workdir``; refuses paths that leave it."""
    FAULTS.check("unpack")
    base = os.path.realpath(workdir)
    count = 0
    with tarfile.open(fileobj=io.BytesIO(decode_blob(blob)), mode="r:*") as tar:
        for member in tar.getmembers():
            if not (member.isfile() or member.isdir()) or not _inside(base, member.name):
                raise WrapperError("lockstep-run: refusing file %r from the job's files" % member.name)
            if hasattr(tarfile, "data_filter"):  # 3.12+, and 3.8-3.11 security releases
                tar.extract(member, base, filter="data")
            else:
                tar.extract(member, base)
            count += member.isfile()
    return count


def fetch_data(data: dict, workdir: str) -> Dict[str, str]:
    """Download the job's data URL (http/https) into the work dir, in chunks; the variables that point at it."""
    env = {}
    url = data.get("url") or ""
    if url.startswith(("http://", "https://")):
        FAULTS.check("fetch")
        dest_dir = os.path.join(workdir, "data")
        os.makedirs(dest_dir, exist_ok=True)
        name = data.get("name") or os.path.basename(url.split("?", 1)[0]) or "input"
        dest = os.path.join(dest_dir, name)
        with open(dest + ".part", "wb") as fh:
            http("GET", url, timeout=300, sink=fh)
        os.replace(dest + ".part", dest)
        env["LOCKSTEP_DATA_PATH"] = dest
        env["LOCKSTEP_DATA_DIR"] = dest_dir
    for key in ("uri", "path"):
        if data.get(key):
            env["LOCKSTEP_DATA_" + key.upper()] = str(data[key])
    return env


# --------------------------------------------------------------------------- masking


class Masker:
    """Secret values replaced by ``*****`` in each line.

    A multi-line secret (a PEM key) reaches the log one line at a time, so each of its lines (of at least
    ``MIN_SECRET_LEN`` characters, without its line ending) is masked as a value of its own. Limits
    (docs/runtime.md): a secret printed in another form (base64, URL-encoded, re-wrapped at another width)
    is not recognised, nor a short last line of a multi-line secret.
    """

    def __init__(self, secrets: List[str]) -> None:
        values = set()
        for s in secrets:
            values.add(s)
            if "\n" in s or "\r" in s:
                for part in s.replace("\r", "\n").split("\n"):
                    values.add(part.strip())
        self.values = sorted((v for v in values if len(v) >= MIN_SECRET_LEN), key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self.values:
            if s in text:
                text = text.replace(s, MASK)
        return text


# --------------------------------------------------------------------------- the log


def _log_path(manifest: dict, rank: int) -> str:
    logs = manifest.get("logs") or {}
    default = os.path.join(manifest["workdir"], ".lockstep", "lockstep-{rank}.log")
    # One manifest serves every node: "{rank}" in the file name becomes this node's rank.
    return str(logs.get("file") or default).replace("{rank}", str(rank))


class Log:
    """Time-stamped, masked lines to a file (and stdout), shipped to the broker's sink while the job runs.

    Nothing here raises to its caller: every failure is counted (``errors``) and the output keeps flowing.
    When the file cannot be written the lines go to a bounded in-memory tail instead (and are shipped from
    there); when stdout fails, echoing stops.
    """

    def __init__(self, manifest: dict, secrets: List[str], rank: int, nonce: str = "") -> None:
        logs = manifest.get("logs") or {}
        self.path = _log_path(manifest, rank)
        self.echo = bool(logs.get("stdout", True))
        self.interval = float(logs.get("interval_s", 5.0))
        self.part_bytes = max(1024, int(logs.get("part_bytes", DEFAULT_PART_BYTES)))
        first = (logs.get("put_urls") or {}).get(str(rank)) or ""
        more = list((logs.get("part_urls") or {}).get(str(rank)) or [])
        self.part_urls = ([first] if first else []) + [str(u) for u in more]  # part n of the log goes to URL n
        self.max_line = max(256, int(logs.get("max_line_bytes", MAX_LINE_BYTES)))
        self.mask = Masker(secrets)
        self.nonce = nonce
        self.lock = threading.Lock()  # one writer at a time
        self.ship_lock = threading.Lock()  # one uploader at a time
        self.errors = collections.Counter()  # type: collections.Counter
        self.tail = collections.deque(maxlen=TAIL_LINES)  # type: collections.deque
        self.memory = collections.deque()  # type: collections.deque  # bytes, once the file failed
        self.memory_bytes = 0
        self.written = 0  # bytes of the log so far (file, or memory once the file failed)
        self.shipped = 0  # bytes of the log in sealed (full) parts
        self.open_sent = 0  # how far the open part was shipped
        self.file_ok = True
        self.file_end = -1  # once the file failed: how much of the log it holds
        self.memory_start = 0  # the log offset of the in-memory tail's first byte
        self.fd = -1
        self.stdout = getattr(sys.stdout, "buffer", None)
        self.stop = threading.Event()
        self.uploader = threading.Thread(target=self._ship_loop, name="lockstep-log-ship", daemon=True)
        try:
            FAULTS.check("log_open")
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            # Our own descriptor, read back for shipping: a command that deletes the file does not stop either.
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            self.written = os.fstat(self.fd).st_size
        except Exception as exc:
            self._fail("file", exc)

    # ---- writing

    def _fail(self, what: str, exc: BaseException) -> None:
        self.errors[what] += 1
        if what == "file" and self.file_ok:
            self.file_ok = False
            note("log file %s unusable (%s: %s); keeping the last %d bytes in memory"
                 % (self.path, type(exc).__name__, exc, MEMORY_TAIL_BYTES))
        elif what == "stdout" and self.echo:
            self.echo = False
            note("stdout unusable (%s); not echoing the log there any more" % type(exc).__name__)

    def _write_file(self, data: bytes) -> None:
        if self.file_ok:
            view = memoryview(data)
            try:
                FAULTS.check("log_write")
                while view:
                    n = os.write(self.fd, view)
                    self.written += n
                    view = view[n:]
                return
            except Exception as exc:
                self._fail("file", exc)
                data = bytes(view)  # what did not reach the file
        if self.file_end < 0:
            self.file_end = self.written  # the file holds the log up to here; the rest lives in memory
            self.memory_start = self.written
        self.memory.append(data)
        self.memory_bytes += len(data)
        self.written += len(data)
        while self.memory_bytes > MEMORY_TAIL_BYTES and len(self.memory) > 1:
            dropped = self.memory.popleft()
            self.memory_bytes -= len(dropped)
            self.memory_start += len(dropped)

    def _echo(self, data: bytes) -> None:
        if not self.echo:
            return
        try:
            FAULTS.check("stdout")
            if self.stdout is not None:
                self.stdout.write(data)
                self.stdout.flush()
            else:  # a text-only stdout: its encoding may not have every character
                sys.stdout.write(data.decode("ascii", "replace"))
                sys.stdout.flush()
        except Exception as exc:
            self._fail("stdout", exc)

    def line(self, stream: str, text: str) -> None:
        try:
            text = self.mask(text.rstrip("\r\n"))
            record = ("%s %s %s\n" % (log_time(), stream, text)).encode("utf-8", "replace")
            with self.lock:
                self._write_file(record)
                self.tail.append(text[:TAIL_LINE_CHARS])
                self._echo(record)
        except Exception as exc:  # never the command's problem
            self.errors["line"] += 1
            note("a log line was lost (%s)" % type(exc).__name__)

    def raw_stdout(self, text: str) -> bool:
        """A line on stdout only (the exit line, a heartbeat): bytes, so no encoding can refuse it. False when
        stdout refused it."""
        data = (text + "\n").encode("utf-8", "replace")
        with self.lock:
            try:
                FAULTS.check("stdout")
                if self.stdout is not None:
                    self.stdout.write(data)
                    self.stdout.flush()
                else:
                    sys.stdout.write(data.decode("ascii", "replace"))
                    sys.stdout.flush()
                return True
            except Exception as exc:
                self.errors["stdout"] += 1
                note("stdout unusable (%s)" % type(exc).__name__)
                return False

    def pump(self, pipe: Any, stream: str) -> threading.Thread:
        """Drain ``pipe`` to the end, whatever happens to the lines: the command never blocks on its output."""
        fd = pipe.fileno()

        def run() -> None:
            pending = b""
            while True:
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except InterruptedError:
                    continue
                except Exception as exc:
                    self.errors["read"] += 1
                    note("reading the command's %s failed (%s)" % (stream, type(exc).__name__))
                    break
                if not chunk:
                    break
                pending += chunk
                start = 0
                while True:
                    cut = pending.find(b"\n", start)
                    if cut < 0 or cut - start >= self.max_line:
                        if len(pending) - start < self.max_line:
                            break
                        # A long line: cut it, the rest follows as lines of their own.
                        piece, start = pending[start:start + self.max_line], start + self.max_line
                    else:
                        piece, start = pending[start:cut], cut + 1
                    self.line(stream, piece.decode("utf-8", "replace"))
                pending = pending[start:]
            if pending:
                self.line(stream, pending.decode("utf-8", "replace"))
            try:
                pipe.close()
            except Exception:
                self.errors["read"] += 1

        t = threading.Thread(target=run, name="lockstep-pump-" + stream, daemon=True)
        t.start()
        return t

    # ---- shipping

    def _read(self, offset: int, size: int) -> bytes:
        """Bytes ``offset`` … ``offset + size`` of the log: from the file, then from the in-memory tail."""
        with self.lock:
            end = offset + size
            file_end = self.written if self.file_end < 0 else self.file_end
            out = b""
            if offset < file_end and self.fd >= 0:
                out = os.pread(self.fd, min(end, file_end) - offset, offset)
                offset += len(out)
            if offset < end and self.file_end >= 0:
                data = b"".join(self.memory)
                if offset < self.memory_start:  # lost: the disk was full and the memory tail moved on
                    self.errors["lost"] += 1
                    out += b"\n[lockstep-run: %d bytes of log lost]\n" % (self.memory_start - offset)
                    offset = self.memory_start
                out += data[offset - self.memory_start:end - self.memory_start]
            return out

    def ship(self, deadline: Optional[float] = None) -> None:
        """Upload what is new: the open part again (at most ``part_bytes``), and each part that filled up.

        Never the whole log again: a part, once full, is never sent twice. One uploader at a time.
        """
        wait = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self.part_urls or not self.ship_lock.acquire(timeout=wait):
            return
        try:
            while True:
                part = self.shipped // self.part_bytes
                if part >= len(self.part_urls):
                    if not self.errors["parts"]:
                        note("the log outgrew its %d upload parts; the rest stays on the machine"
                             % len(self.part_urls))
                    self.errors["parts"] += 1
                    return
                start = part * self.part_bytes
                end = min(self.written, start + self.part_bytes)
                full = end - start == self.part_bytes
                if end <= start or (end == self.open_sent and not full):
                    return
                body = self._read(start, end - start)
                FAULTS.check("upload")
                kw = {} if deadline is None else {"deadline": deadline, "attempts": 2, "timeout": 15.0}
                put(self.part_urls[part], body, "text/plain; charset=utf-8", **kw)
                if not full:
                    self.open_sent = end
                    return
                self.shipped = end
                self.open_sent = 0
        except Exception as exc:  # the next round tries again; the job goes on
            self.errors["upload"] += 1
            note("log upload failed: %s" % type(exc).__name__)
        finally:
            self.ship_lock.release()

    def _ship_loop(self) -> None:
        while not self.stop.wait(self.interval):
            self.ship()

    def start(self) -> None:
        if self.part_urls:
            self.uploader.start()

    def close(self, deadline: float) -> None:
        """The last shipment, bounded by ``deadline``; the file closed."""
        self.stop.set()
        self.ship(deadline)
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except Exception:
                self.errors["file"] += 1
            self.fd = -1
            self.file_ok = False


# --------------------------------------------------------------------------- the heartbeat


class Heartbeat:
    """A small document every ``heartbeat_s`` that says the wrapper is alive and what it is doing.

    It goes where the status goes (``status_dir``: ``heartbeat-<rank>.json``; ``heartbeat_put_urls``), or as a
    ``LOCKSTEP-BEAT <nonce> {...}`` line on stdout only (``heartbeat_stdout``: markets whose logs API is the only
    way out). It beats only while the main loop makes progress (:meth:`tick`): a wrapper stuck somewhere goes
    silent, and the broker releases the machine (providers/runtime/logs.py ``wrapper_silent``).
    """

    def __init__(self, manifest: dict, log: Log, rank: int) -> None:
        logs = manifest.get("logs") or {}
        self.every = max(0.05, float(manifest.get("heartbeat_s") or DEFAULT_HEARTBEAT_S))
        self.status_dir = logs.get("status_dir") or ""
        self.url = (logs.get("heartbeat_put_urls") or {}).get(str(rank)) or ""
        self.to_stdout = bool(logs.get("heartbeat_stdout"))
        self.log = log
        self.rank = rank
        self.phase = "starting"
        self.notice = None  # type: Optional[dict]
        self.lock = threading.Lock()
        self.seq = 0
        self.progress = time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="lockstep-heartbeat", daemon=True)

    @property
    def wanted(self) -> bool:
        return bool(self.status_dir or self.url or self.to_stdout)

    def tick(self, phase: str = "") -> None:
        self.progress = time.monotonic()
        if phase:
            self.phase = phase

    def beat(self) -> None:
        with self.lock:  # the notice watcher beats at once too
            self._beat()

    def _beat(self) -> None:
        self.seq += 1
        doc = {"at": log_time(), "seq": self.seq, "phase": self.phase, "rank": self.rank, "pid": os.getpid()}
        if self.notice is not None:
            doc["notice"] = self.notice
        body = json.dumps(doc, sort_keys=True)
        if self.status_dir:
            try:
                FAULTS.check("heartbeat")
                os.makedirs(self.status_dir, exist_ok=True)
                _atomic_write(os.path.join(self.status_dir, "heartbeat-%d.json" % self.rank), body.encode())
            except Exception:
                self.log.errors["heartbeat"] += 1
        if self.url:
            try:
                FAULTS.check("heartbeat")
                put(self.url, body.encode(), "application/json", attempts=1, timeout=10.0)
            except Exception:
                self.log.errors["heartbeat"] += 1
        if self.to_stdout:
            self.log.raw_stdout(BEAT_MARKER + (self.log.nonce + " " if self.log.nonce else "") + body)

    def _loop(self) -> None:
        while True:
            # While the command runs the main loop ticks every 0.1 s: stuck for three beats, say nothing, so the
            # broker notices. The steps before it (download, registry login) are bounded by their own timeouts.
            if self.phase != "running" or time.monotonic() - self.progress < 3 * self.every + 5:
                self.beat()
            if self.stop.wait(self.every):
                return

    def start(self) -> None:
        if self.wanted:
            self.thread.start()


# --------------------------------------------------------------------------- the command


# Inside a container the image decides: bash (with pipefail) when it has one, else sh (dash has no pipefail).
CONTAINER_SHELL = ["sh", "-c", 'if command -v bash >/dev/null 2>&1; then exec bash -o pipefail -c "$1"; '
                               'else exec sh -c "$1"; fi', "lockstep-sh"]


def command_argv(manifest: dict, env_names: List[str]) -> List[str]:
    """The command to exec: the job's command under ``bash -o pipefail -c`` where bash exists (``sh -c``
    elsewhere), in a container when asked.

    Variables go into the container by name only (``-e NAME``), so their values never appear in a process list.
    """
    command = manifest["command"]
    box = manifest.get("container") or {}
    runtime = box.get("runtime", "none")
    workdir = manifest["workdir"]
    inner = CONTAINER_SHELL + [command]
    if runtime == "docker":
        argv = ["docker", "run", "--rm", "--network", "host", "--ipc", "host", "--init",
                "-v", "%s:%s" % (workdir, workdir), "-w", workdir]
        if box.get("gpus", True):
            argv += ["--gpus", "all"]
        for name in env_names:
            argv += ["-e", name]
        argv += list(box.get("args") or [])
        return argv + [box["image"]] + inner
    if runtime == "apptainer":
        image = box["image"]
        uri = image if "://" in image else "docker://" + image
        return ["apptainer", "exec", "--nv", "--pwd", workdir, "--bind", workdir, uri] + inner
    bash = shutil.which("bash")
    return [bash, "-o", "pipefail", "-c", command] if bash else ["sh", "-c", command]


def registry_login(box: dict, env: dict) -> None:
    """``docker login`` with the job's registry secret, the password on stdin."""
    reg = box.get("registry") or {}
    if not reg or box.get("runtime") != "docker":
        return
    password = env.get(reg.get("password_env", ""), "")
    subprocess.run(["docker", "login", "--username", reg["username"], "--password-stdin", reg["server"]],
                   input=password.encode(), check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   timeout=300)


def become_subreaper() -> bool:
    """Orphans of the command's tree become the wrapper's children, not init's (Linux): so they can be found,
    signalled and reaped. False where the call does not exist."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:
        return False


def descendants(root: int) -> List[int]:
    """Every live process below ``root`` (a walk of /proc; empty where there is none)."""
    children = collections.defaultdict(list)  # type: Dict[int, List[int]]
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ")"
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) < 2 or fields[0] == b"Z":
            continue
        children[int(fields[1])].append(int(name))
    out = []  # type: List[int]
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


class Runner:
    """The command's process tree: started, watched, signalled, stopped (TERM, then KILL ``grace`` after it)."""

    POLL_S = 0.1

    def __init__(self, argv: List[str], env: dict, cwd: str, log: Log, grace: float,
                 heartbeat: Optional[Heartbeat] = None) -> None:
        self.log = log
        self.grace = grace
        self.heartbeat = heartbeat
        FAULTS.check("spawn")
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.pumps = [log.pump(self.proc.stdout, "out"), log.pump(self.proc.stderr, "err")]
        self.reason = ""
        self.stop_at = 0.0
        self.killed = False
        self.returncode = None  # type: Optional[int]

    def tree(self) -> List[int]:
        """The command's processes: its group's leader and everything below the wrapper (the command, its
        children, and orphans the wrapper adopted as their subreaper)."""
        pids = descendants(os.getpid())
        if self.returncode is None and self.proc.pid not in pids:
            pids.append(self.proc.pid)
        return pids

    def send(self, sig: int) -> None:
        """``sig`` to the command's process group and to every process of its tree (some started sessions of
        their own: torchrun's workers, daemons)."""
        try:
            os.killpg(self.proc.pid, sig)
        except OSError:
            pass
        for pid in self.tree():
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def request_stop(self, reason: str, sig: int = signal.SIGTERM) -> None:
        """Pass ``sig`` on now; ``wait`` KILLs what is left ``grace`` after the first stop.

        Called from a signal handler: it only sends signals and sets fields.
        """
        if not self.reason:
            self.reason = reason
            self.stop_at = time.monotonic()
        self.send(sig)

    def _reap(self) -> None:
        """Collect every exited child: the command (its status kept) and adopted orphans (dropped)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            if pid == self.proc.pid:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                self.returncode = code
                self.proc.returncode = code  # Popen must not wait for it again

    def wait(self, max_duration: Optional[float]) -> int:
        """The command's return code (negative: killed by that signal), once the command and every process of
        its tree have ended — a stop KILLs whatever is left ``grace`` after it."""
        started = time.monotonic()
        while True:
            self._reap()
            now = time.monotonic()
            if self.heartbeat is not None:
                self.heartbeat.tick()
            if max_duration is not None and not self.reason and now - started >= max_duration:
                self.log.line("lockstep", "max_duration of %g s reached: stopping the command" % max_duration)
                self.request_stop("max_duration")
            if self.reason and not self.killed and now - self.stop_at >= self.grace:
                left = self.tree()
                if left:
                    self.log.line("lockstep", "%d process(es) still running %g s after the stop: killing them"
                                  % (len(left), self.grace))
                self.send(signal.SIGKILL)
                self.killed = True
            if self.returncode is not None:
                rest = self.tree()
                if not rest:
                    break
                if not self.reason:  # a normal end with processes left behind (daemons, background jobs)
                    self.log.line("lockstep", "the command ended; stopping %d process(es) it left running"
                                  % len(rest))
                    self.request_stop("leftover")
                elif self.killed and now - self.stop_at >= self.grace + 10:
                    break  # unkillable (D state): do not hold the machine for them
            time.sleep(self.POLL_S)
        for t in self.pumps:
            t.join(timeout=10)
        assert self.returncode is not None
        return self.returncode


def watch_fence(manifest: dict, runner: Runner, log: Log, every_s: float = 2.0) -> None:
    """Fencing (issue 24; docs/runtime.md): where the job's status location holds a fence (``logs.fence``, a
    file naming the attempt the broker runs now), an attempt it names a later one than this has been superseded
    (requeued and placed again while this one ran on, e.g. on a node Slurm lost): its command is stopped as for
    a signal to the job, and the wrapper exits. Self-contained: one thread, reading one small file."""
    path = (manifest.get("logs") or {}).get("fence")
    mine = int((manifest.get("env") or {}).get("LOCKSTEP_ATTEMPT") or 0)
    if not path or not mine:
        return

    def watch() -> None:
        while runner.returncode is None:  # set by Runner.wait's reaper (a poll() here could steal its status)
            try:
                with open(path, encoding="utf-8") as fh:
                    current = int(fh.read().strip() or 0)
            except (OSError, ValueError):
                current = 0
            if current > mine:
                log.line("lockstep", f"superseded by attempt {current}: stopping attempt {mine}")
                runner.request_stop("signal")
                return
            time.sleep(every_s)

    threading.Thread(target=watch, name="lockstep-fence", daemon=True).start()


def read_control(logs: dict) -> Optional[dict]:
    """The broker's control document for this attempt (``logs.control_url``, a presigned GET, or
    ``logs.control_file``, a file a boot script keeps fetched), None while there is none."""
    import urllib.error

    url, path = logs.get("control_url"), logs.get("control_file")
    try:
        if url:
            raw = http("GET", url, None, None, timeout=10, attempts=2)
        elif path:
            with open(path, "rb") as fh:
                raw = fh.read()
        else:
            return None
        doc = json.loads(raw.decode("utf-8") or "{}")
    except urllib.error.HTTPError:  # 404 (none yet), 403 (its URL expired): none to act on
        return None
    except (OSError, ValueError):  # unreachable now, or half written: asked again next round
        return None
    return doc if isinstance(doc, dict) else None


def watch_control(manifest: dict, runner: Runner, deliver: Callable[[int], None], log: Log) -> None:
    """Signals from the broker where the market cannot send one itself (AWS; docs/runtime.md, "Signals from
    the broker"): the broker writes ``{"seq": n, "signal": "SIGTERM"}`` to the attempt's control object, each new
    ``seq`` a new signal; the wrapper reads it every ``logs.control_every_s`` seconds (5) and hands the signal to
    ``deliver`` as if the market had sent it (a stop for SIGTERM/INT/HUP, passed on for the rest). One thread."""
    logs = manifest.get("logs") or {}
    if not (logs.get("control_url") or logs.get("control_file")):
        return
    every = max(0.05, float(logs.get("control_every_s") or 5.0))

    def watch() -> None:
        last = 0
        while runner.returncode is None:
            doc = read_control(logs)
            try:
                seq = int((doc or {}).get("seq") or 0)
            except (TypeError, ValueError):
                seq = 0
            name = str((doc or {}).get("signal") or "")
            if seq > last:
                last = seq
                if name in SIGNALS and hasattr(signal, name):
                    log.line("lockstep", "%s from the broker" % name)
                    deliver(int(getattr(signal, name)))
                else:
                    log.line("lockstep", "the broker's control names no signal this wrapper sends: %r" % name)
            time.sleep(every)

    threading.Thread(target=watch, name="lockstep-control", daemon=True).start()


class Notices:
    """The market's interruption notice (issue 30; docs/runtime.md, "Interruption notices").

    ``manifest["notice"]``: ``imds`` (AWS: poll the instance metadata service, IMDSv2, every ``every_s`` s for
    ``spot/instance-action`` and, with ``rebalance``, ``events/recommendations/rebalance``; the endpoint is
    ``LOCKSTEP_IMDS_URL`` where set, else ``imds_url``, else 169.254.169.254), ``trap`` (Slurm: the name of the
    signal the broker asked Slurm to send before the end, ``--signal``; the wrapper takes it as the notice instead
    of passing it on), ``deliver`` (the signal the command gets, SIGTERM unless it says), ``file`` (the notice
    file the command reads). On the first notice of a kind: the notice file, ``notice-<rank>.json`` beside the
    status (and its URL), a heartbeat at once that carries it, a log line, and for an interruption the signal.
    """

    def __init__(self, manifest: dict, environ: dict, rank: int) -> None:
        conf = manifest.get("notice") or {}
        self.conf = conf if isinstance(conf, dict) else {}
        self.imds = bool(self.conf.get("imds"))
        self.base = (environ.get("LOCKSTEP_IMDS_URL") or self.conf.get("imds_url")
                     or "http://169.254.169.254").rstrip("/")
        self.every = max(0.05, float(self.conf.get("every_s") or 5.0))
        self.rebalance = bool(self.conf.get("rebalance", True))
        self.trap = str(self.conf.get("trap") or "")
        self.deliver = str(self.conf.get("deliver") or "SIGTERM")
        if not hasattr(signal, self.deliver):
            self.deliver = "SIGTERM"
        workdir = str(manifest.get("workdir") or ".")
        self.file = str(self.conf.get("file") or os.path.join(workdir, ".lockstep-notice.json"))
        self.logs = manifest.get("logs") or {}
        self.rank = rank
        self.seen = {}  # type: Dict[str, dict]
        self.trapped = threading.Event()
        self.delivered = False
        self.token = ""
        self.token_at = 0.0

    @property
    def wanted(self) -> bool:
        return self.imds or bool(self.trap)

    def env(self) -> Dict[str, str]:
        """What the command sees from the start (the notice itself comes in the file and the signal)."""
        if not self.wanted:
            return {}
        return {"LOCKSTEP_NOTICE_FILE": self.file, "LOCKSTEP_NOTICE_SIGNAL": self.deliver,
                "LOCKSTEP_NOTICE_SOURCE": "imds" if self.imds else "slurm"}

    def is_trap(self, signum: int) -> bool:
        return bool(self.trap) and getattr(signal, self.trap, None) == signum

    def _imds_get(self, path: str) -> Optional[dict]:
        """One metadata document, None on 404 (no notice). A token is reused for most of its 6 h."""
        import urllib.error

        now = time.monotonic()
        if not self.token or now - self.token_at > 5 * 3600:
            self.token = http("PUT", self.base + "/latest/api/token", b"",
                              {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}, timeout=2, attempts=2).decode()
            self.token_at = now
        try:
            body = http("GET", self.base + "/latest/meta-data/" + path, None,
                        {"X-aws-ec2-metadata-token": self.token}, timeout=2, attempts=2)
        except urllib.error.HTTPError as exc:
            if exc.code == 401:  # the token expired early: a new one next round
                self.token = ""
            if exc.code in (401, 404):
                return None
            raise
        try:
            doc = json.loads(body.decode("utf-8"))
        except ValueError:
            return {"raw": body.decode("utf-8", "replace")[:200]}
        return doc if isinstance(doc, dict) else {"raw": str(doc)[:200]}

    def poll(self) -> List[dict]:
        """The notices the market gives now (AWS)."""
        found = []
        action = self._imds_get("spot/instance-action")
        if action is not None:
            found.append({"kind": "interruption", "source": "imds", "action": str(action.get("action", "")),
                          "deadline": str(action.get("time", ""))})
        if self.rebalance:
            rebalance = self._imds_get("events/recommendations/rebalance")
            if rebalance is not None:
                found.append({"kind": "rebalance", "source": "imds", "action": "",
                              "deadline": "", "notice_time": str(rebalance.get("noticeTime", ""))})
        return found

    def act(self, doc: dict, runner: "Runner", log: Log, heartbeat: Optional[Heartbeat]) -> None:
        kind = doc["kind"]
        if kind in self.seen:
            return
        doc = dict(doc, seen_at=log_time(), rank=self.rank)
        interruption = kind == "interruption"
        if interruption:
            doc["signal"] = self.deliver
        self.seen[kind] = doc
        body = json.dumps(doc, sort_keys=True).encode()
        log.line("lockstep", "notice from the market: %s" % json.dumps(doc, sort_keys=True))
        try:
            _atomic_write(self.file, body)
        except Exception as exc:
            log.line("lockstep", "notice file not written: %s" % exc)
        status_dir = self.logs.get("status_dir")
        if status_dir:
            try:
                os.makedirs(status_dir, exist_ok=True)
                _atomic_write(os.path.join(status_dir, "notice-%d.json" % self.rank), body)
            except Exception as exc:
                log.line("lockstep", "notice not written beside the status: %s" % exc)
        url = (self.logs.get("notice_put_urls") or {}).get(str(self.rank))
        if url:
            try:
                put(url, body, "application/json", attempts=3, timeout=10.0)
            except Exception as exc:
                log.line("lockstep", "notice upload failed: %s" % type(exc).__name__)
        if heartbeat is not None:
            heartbeat.notice = doc
            if heartbeat.wanted:
                heartbeat.beat()
        if interruption and runner.returncode is None:
            self.delivered = True
            runner.send(getattr(signal, self.deliver))

    def watch(self, runner: "Runner", log: Log, heartbeat: Optional[Heartbeat]) -> None:
        if not self.wanted:
            return

        def loop() -> None:
            while runner.returncode is None:
                if self.trapped.is_set():
                    self.trapped.clear()
                    self.act({"kind": "interruption", "source": "slurm", "action": "signal " + self.trap,
                              "deadline": ""}, runner, log, heartbeat)
                if self.imds:
                    try:
                        for doc in self.poll():
                            self.act(doc, runner, log, heartbeat)
                    except Exception as exc:  # an unreachable metadata service: try again next round
                        log.errors["notice"] += 1
                        if log.errors["notice"] == 1:
                            log.line("lockstep", "metadata service not answering: %s" % type(exc).__name__)
                self.trapped.wait(self.every)  # a trapped signal wakes it at once

        threading.Thread(target=loop, name="lockstep-notice", daemon=True).start()


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: 128 + N for a command killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


# --------------------------------------------------------------------------- status and end


def _atomic_write(path: str, body: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(body)
    os.replace(tmp, path)


def write_status(manifest: dict, rank: int, status: dict, deadline: float) -> bool:
    """The status to the status directory and its URL; True when it reached at least one of them."""
    body = json.dumps(status, sort_keys=True).encode()
    logs = manifest.get("logs") or {}
    done = False
    status_dir = logs.get("status_dir")
    if status_dir:
        try:
            FAULTS.check("status_write")
            os.makedirs(status_dir, exist_ok=True)
            _atomic_write(os.path.join(status_dir, "status-%d.json" % rank), body)
            done = True
        except Exception as exc:
            note("status not written to %s: %s: %s" % (status_dir, type(exc).__name__, exc))
    url = (logs.get("status_put_urls") or {}).get(str(rank))
    if url:
        try:
            FAULTS.check("status_put")
            put(url, body, "application/json", deadline=deadline, attempts=4, timeout=15.0)
            done = True
        except Exception as exc:
            note("status upload failed: %s" % type(exc).__name__)
    return done


def _run_quietly(argv: List[str], timeout: float) -> str:
    """Run one end-of-job command; "" when it succeeded, else why not."""
    try:
        FAULTS.check("shutdown")
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout)
    except Exception as exc:
        return "%s: %s" % (type(exc).__name__, exc)
    if proc.returncode != 0:
        return "exit code %d: %s" % (proc.returncode, proc.stdout.decode("utf-8", "replace").strip()[-300:])
    return ""


def shut_down(manifest: dict, say: Callable[[str], None]) -> bool:
    """The manifest's ``shutdown``, retried; then each of ``shutdown_fallbacks``; then sysrq (``o``: power off)
    where the manifest allows it and the kernel does. True once one of them succeeded."""
    argv = manifest.get("shutdown")
    if not argv:
        return True
    attempts = int(manifest.get("shutdown_attempts") or SHUTDOWN_ATTEMPTS)
    timeout = float(manifest.get("shutdown_timeout_s") or SHUTDOWN_TIMEOUT_S)
    pause = float(manifest.get("shutdown_retry_s", 1.0))  # before try n+1: n times this, 5 s at most
    for attempt in range(1, attempts + 1):
        why = _run_quietly([str(a) for a in argv], timeout)
        if not why:
            return True
        say("shutdown (%s) failed, try %d of %d: %s" % (" ".join(argv), attempt, attempts, why))
        if attempt < attempts:
            time.sleep(min(5.0, pause * attempt))
    for fallback in manifest.get("shutdown_fallbacks") or []:
        why = _run_quietly([str(a) for a in fallback], timeout)
        if not why:
            say("shutdown fell back to %s" % " ".join(fallback))
            return True
        say("shutdown fallback (%s) failed: %s" % (" ".join(fallback), why))
    if manifest.get("shutdown_sysrq"):
        try:
            with open("/proc/sys/kernel/sysrq", "w") as fh:
                fh.write("1")
            with open("/proc/sysrq-trigger", "w") as fh:
                fh.write("o")
            return True
        except Exception as exc:
            say("sysrq power-off refused: %s" % exc)
    return False


def _mark(environ: dict, what: str) -> None:
    """Tell the boot script how far the end got (it shuts the machine down itself when the wrapper did not)."""
    path = environ.get(END_MARK_VAR)
    if path:
        try:
            with open(path, "a") as fh:
                fh.write(what + "\n")
        except Exception as exc:
            note("end mark not written: %s" % exc)


def _max_rss_kb() -> int:
    """The wrapper's peak memory: VmHWM (this program's own; getrusage's maxrss also counts the process it
    was exec'd from), else getrusage."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except Exception:
        pass
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    except Exception:
        return 0


class Job:
    """One run of the wrapper: what the signal handlers, the run and the end share."""

    def __init__(self) -> None:
        self.signals = []  # type: List[int]
        self.runner = None  # type: Optional[Runner]
        self.log = None  # type: Optional[Log]
        self.notices = None  # type: Optional[Notices]

    def on_signal(self, signum: int, _frame: Any) -> None:
        self.signals.append(signum)
        notices = self.notices
        if notices is not None and notices.is_trap(signum):
            notices.trapped.set()  # the notice watcher acts on it (a handler only sets flags)
            return
        self.deliver(signum)

    def deliver(self, signum: int) -> None:
        """A signal to the job: the command stops on SIGTERM/INT/HUP (the rest are passed on only)."""
        runner = self.runner
        if runner is None:
            return  # before the command: the run stops at its next step (stopped())
        if signal.Signals(signum).name in STOPPING:
            runner.request_stop("signal", signum)
        else:
            runner.send(signum)

    def stopped(self) -> bool:
        notices = self.notices
        return any(signal.Signals(s).name in STOPPING and not (notices is not None and notices.is_trap(s))
                   for s in self.signals)

    def install(self) -> None:
        for name in SIGNALS:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), self.on_signal)
        self.signals.extend(EARLY_SIGNALS)  # those that came while the wrapper was loading


def main(argv: Optional[List[str]] = None, environ: Optional[dict] = None) -> int:
    job = Job()
    job.install()  # first: a signal during the rendezvous must still end with a status and the shutdown
    argv = sys.argv if argv is None else argv
    environ = dict(os.environ if environ is None else environ)
    started = log_time()
    manifest = {}  # type: Dict[str, Any]
    code, reason, failure = WRAPPER_FAILED, "error", ""
    rank = rank_hint(environ)
    log = None  # type: Optional[Log]
    heartbeat = None  # type: Optional[Heartbeat]
    try:
        try:
            manifest = load_manifest(argv, environ)
            if not isinstance(manifest, dict) or not manifest.get("command"):
                raise WrapperError("lockstep-run: the manifest has no command")
        except Exception as exc:
            failure = "could not read the manifest: %s: %s" % (type(exc).__name__, exc)
            manifest = manifest if isinstance(manifest, dict) else {}
        job.notices = Notices(manifest, environ, rank)
        for early in list(job.signals):  # a trapped signal that came while the wrapper was loading
            if job.notices.is_trap(early):
                job.notices.trapped.set()
        job_env = {str(k): str(v) for k, v in (manifest.get("env") or {}).items()}
        secrets = {str(k): str(v) for k, v in (manifest.get("secrets") or {}).items()}
        manifest.setdefault("workdir", os.path.join(environ.get("TMPDIR", "/tmp"),
                                                    "lockstep-%s" % job_env.get("LOCKSTEP_JOB_ID", "job")))
        workdir = manifest["workdir"]
        nonce = str(manifest.get("exit_nonce") or environ.get(NONCE_VAR) or "")
        rdzv = {}  # type: Dict[str, str]
        if not failure:
            try:
                FAULTS.check("mkdir")
                os.makedirs(workdir, exist_ok=True)
                # No log and no heartbeat before the rendezvous: on a peer list the rank (which names both) is
                # not known yet; the broker allows the rendezvous's wait before it expects a heartbeat.
                rdzv = rendezvous(manifest, environ, job.stopped)
                rank = int(rdzv["LOCKSTEP_NODE_RANK"])
            except Exception as exc:
                failure = str(exc) if isinstance(exc, WrapperError) else "rendezvous failed: %s: %s" % (
                    type(exc).__name__, exc)
        log = Log(manifest, list(secrets.values()), rank, nonce)
        heartbeat = Heartbeat(manifest, log, rank)
        heartbeat.start()
        job.log = log
        log.start()
        if failure:
            raise WrapperError(failure)
        heartbeat.tick("preparing")
        env = dict(environ)
        for name in ("LOCKSTEP_MANIFEST", "LOCKSTEP_TEST_FAULTS", NONCE_VAR, END_MARK_VAR):
            env.pop(name, None)
        env.update(job_env)
        env.update(rdzv)
        env["LOCKSTEP_WORKDIR"] = workdir
        job.notices.rank = rank
        env.update(job.notices.env())
        if manifest.get("files"):
            n = unpack_files(manifest["files"], workdir)
            log.line("lockstep", "unpacked %d file(s) into %s" % (n, workdir))
        env.update(fetch_data(manifest.get("data") or {}, workdir))
        if manifest.get("checkpoint_dir"):
            os.makedirs(manifest["checkpoint_dir"], exist_ok=True)
        env.update(secrets)
        names = sorted(set(job_env) | set(rdzv) | set(secrets) | {
            k for k in env if k.startswith("LOCKSTEP_")} - {"LOCKSTEP_MANIFEST"})
        box = manifest.get("container") or {}
        registry_login(box, env)
        password_env = (box.get("registry") or {}).get("password_env")
        if password_env:  # used to log in; not the command's business
            env.pop(password_env, None)
            names = [n for n in names if n != password_env]
        cmd = command_argv(manifest, names)
        if job.stopped():
            raise WrapperError("lockstep-run: stopped by a signal before the command started")
        become_subreaper()
        log.line("lockstep", "node %d of %s (head %s): starting %s" % (
            rank, rdzv["LOCKSTEP_NUM_NODES"], rdzv["LOCKSTEP_HEAD_ADDR"], shlex.quote(cmd[0])))
        heartbeat.tick("running")
        runner = Runner(cmd, env, workdir, log, float(manifest.get("grace_s", 30)), heartbeat)
        job.runner = runner
        watch_fence(manifest, runner, log)
        watch_control(manifest, runner, job.deliver, log)
        job.notices.watch(runner, log, heartbeat)
        if job.stopped():  # the signal came while the command was starting
            runner.request_stop("signal")
        max_duration = manifest.get("max_duration_s")
        returncode = runner.wait(float(max_duration) if max_duration else None)
        if runner.reason == "signal":
            log.line("lockstep", "the command was stopped by a signal to the job (preemption or cancel)")
        code = exit_code_of(returncode)
        reason = runner.reason if runner.reason in ("signal", "max_duration") else "exited"
        if reason == "exited" and job.notices.delivered:  # it ended on the market's notice: not done, requeue it
            log.line("lockstep", "the command ended after the market's interruption notice")
            reason = "signal"
    except BaseException as exc:  # the wrapper's own failure still ends with a status and the shutdown
        why = str(exc) if isinstance(exc, WrapperError) else "%s: %s" % (type(exc).__name__, exc)
        if log is not None:
            log.line("lockstep", "could not run the command: " + why)
        else:
            note("could not run the command: " + why)
        if job.runner is not None:  # a crash while it ran: stop the command, as a normal end would
            try:
                job.runner.send(signal.SIGKILL)
            except Exception:
                pass
        stops = [sg for sg in job.signals if signal.Signals(sg).name in STOPPING]
        if stops and job.runner is None:  # stopped before the command started (preemption during the rendezvous)
            code, reason = 128 + stops[0], "signal"
    finally:
        code = finish(manifest, environ, job, log, heartbeat, rank, code, reason, started)
    return code


def finish(manifest: dict, environ: dict, job: Job, log: Optional[Log], heartbeat: Optional[Heartbeat], rank: int,
           code: int, reason: str, started: str) -> int:
    """The end that nothing skips: status (first), the last log part, the exit line, the shutdown."""
    deadline = time.monotonic() + float(manifest.get("end_upload_s") or END_UPLOAD_BUDGET_S)

    def say(text: str) -> None:
        if log is not None:
            log.line("lockstep", text)
        else:
            note(text)

    try:
        if heartbeat is not None:
            heartbeat.tick("ending")
        tail = list(log.tail)[-10:] if log is not None else []
        status = {"exit_code": code, "reason": reason, "rank": rank, "host": socket.gethostname(),
                  "started_at": started, "ended_at": log_time(), "last_lines": tail,
                  "wrapper": {"max_rss_kb": _max_rss_kb(), "signals": [int(s) for s in job.signals],
                              "errors": dict(log.errors) if log is not None else {}}}
        if job.notices is not None and job.notices.seen:
            status["notice"] = job.notices.seen.get("interruption") or job.notices.seen.get("rebalance")
        if write_status(manifest, rank, status, deadline):  # first: the broker ends the job on it
            _mark(environ, "status")
        say("command ended: exit code %d (%s)" % (code, reason))
        if log is not None:
            log.close(deadline)
        nonce = str(manifest.get("exit_nonce") or environ.get(NONCE_VAR) or "")
        line = EXIT_MARKER + (nonce + " " if nonce else "") + json.dumps(status, sort_keys=True)
        printed = False
        if log is not None:
            printed = log.raw_stdout(line)
        else:
            try:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
                printed = True
            except Exception:
                note("the exit line could not be written")
        if printed:  # else the boot script prints one (Vast)
            _mark(environ, "exit-line")
    except BaseException as exc:
        note("the end failed before the shutdown: %s: %s" % (type(exc).__name__, exc))
    finally:
        if heartbeat is not None:
            heartbeat.stop.set()
        try:
            if shut_down(manifest, say):
                if manifest.get("shutdown"):
                    _mark(environ, "shutdown")
            else:
                note("every way to shut the machine down failed; the broker releases it when the heartbeat stops")
        except BaseException as exc:
            note("shutdown failed: %s: %s" % (type(exc).__name__, exc))
    return code


if __name__ == "__main__":
    sys.exit(main())
