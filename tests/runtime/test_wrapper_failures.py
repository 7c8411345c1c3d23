"""The in-job wrapper when things go wrong (issue 27): whatever fails, the output keeps flowing, the status is
written and the machine is shut down, and no process of the job is left behind.

Each case runs the real wrapper (tests/runtime/harness.py) with a shutdown command that takes notes. Times are
scaled down (a grace of seconds, not minutes); every wait is for an event, bounded.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.runtime import wrapper
from providers.runtime.logs import exit_from_log, parse_log
from tests.runtime.harness import Node, alive, wait_for_file


def ended_well(node: Node, code: int, reason: str) -> dict:
    """The common end of every case: this status written, the shutdown run, the marks the boot script reads."""
    st = node.status()
    assert (st["exit_code"], st["reason"]) == (code, reason), st
    assert node.noted(), "the shutdown command never ran"
    assert node.marks()[-1] == "shutdown" and "status" in node.marks()
    return st


# --------------------------------------------------------------------------- output that cannot be written


def test_a_full_disk_does_not_stop_the_command(tmp_path: Path) -> None:
    """The log file stops growing at 200 kB (RLIMIT_FSIZE: EFBIG, as a full disk gives ENOSPC); the command
    prints 2 MB more, is not blocked, and max_duration is set (the case that crashed)."""
    node = Node(tmp_path, "i=0; while [ $i -lt 20000 ]; do echo line-$i-padding-padding-padding-padding-padding-pad; "
                          "i=$((i+1)); done; echo last-line; exit 5", max_duration_s=120)

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    code, out, _ = node.run(preexec=small_files)
    assert code == 5
    st = ended_well(node, 5, "exited")
    assert st["wrapper"]["errors"]["file"] >= 1
    assert os.path.getsize(tmp_path / "logs" / "rank-0.log") <= 200_000
    assert "last-line" in st["last_lines"]  # the in-memory tail kept what the disk could not
    assert b"out last-line" in out  # and stdout still had every line


def test_a_closed_stdout_does_not_stop_the_command(tmp_path: Path) -> None:
    node = Node(tmp_path, "for i in $(seq 1 5000); do echo line-$i; done; exit 4")
    proc = node.start()
    assert proc.stdout is not None
    proc.stdout.close()  # the reader went away: every echo is a broken pipe
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err
    st = ended_well(node, 4, "exited")
    assert st["wrapper"]["errors"]["stdout"] >= 1
    assert "out line-5000" in node.log_text()


def test_an_ascii_stdout_and_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    node = Node(tmp_path, r"printf 'bar \342\226\210 block\n'; printf 'raw \377\376 bytes\n'; echo done")
    code, out, _ = node.run(env={"PYTHONIOENCODING": "ascii", "LANG": "C", "LC_ALL": "C"})
    assert code == 0
    ended_well(node, 0, "exited")
    text = node.log_text()
    assert "bar \u2588 block" in text and "raw \ufffd\ufffd bytes" in text and "out done" in text
    assert "bar \u2588 block".encode() in out


def test_a_command_that_deletes_its_log(tmp_path: Path) -> None:
    node = Node(tmp_path, 'rm -f "$LOG"; echo after-delete; exit 2')
    node.manifest["env"]["LOG"] = str(tmp_path / "logs" / "rank-0.log")
    code, out, _ = node.run()
    assert code == 2
    st = ended_well(node, 2, "exited")
    assert "after-delete" in st["last_lines"] and b"out after-delete" in out


# --------------------------------------------------------------------------- the rendezvous


@pytest.fixture
def garbage_server() -> Iterator[str]:
    """An HTTP 'server' on loopback that answers every request with a malformed status line."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.recv(4096)
                    conn.sendall(b"NOT-HTTP garbage\r\n\r\n")
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/peers.json"
    stop.set()
    t.join(timeout=5)
    sock.close()


def test_a_malformed_peers_answer(tmp_path: Path, garbage_server: str) -> None:
    node = Node(tmp_path, "echo never", rendezvous={"mode": "peers", "peers_url": garbage_server, "wait_s": 1})
    code, _, _ = node.run(env={"LOCKSTEP_NODE_ID": "i-a"})
    assert code == wrapper.WRAPPER_FAILED
    st = ended_well(node, wrapper.WRAPPER_FAILED, "error")
    assert any("peer list did not arrive" in ln and "BadStatusLine" in ln for ln in st["last_lines"]), st


def test_a_peer_entry_without_an_address(tmp_path: Path) -> None:
    peers = tmp_path / "peers.json"
    peers.write_text(json.dumps({"nodes": [{"id": "i-a"}]}))
    node = Node(tmp_path, "echo never", rendezvous={"mode": "peers", "peers_file": str(peers), "wait_s": 1})
    code, _, _ = node.run(env={"LOCKSTEP_NODE_ID": "i-a"})
    assert code == wrapper.WRAPPER_FAILED
    st = ended_well(node, wrapper.WRAPPER_FAILED, "error")
    assert any("without id or addr" in ln for ln in st["last_lines"]), st


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGTERM])
def test_a_signal_during_the_rendezvous(tmp_path: Path, sig: signal.Signals) -> None:
    node = Node(tmp_path, "echo never", rendezvous={"mode": "peers", "peers_file": str(tmp_path / "none"),
                                                    "wait_s": 600})
    proc = node.start(env={"LOCKSTEP_NODE_ID": "i-a"})
    node.wait_for_handlers()
    proc.send_signal(sig)
    proc.communicate(timeout=30)  # not the 600 s wait
    assert proc.returncode == 128 + sig
    st = ended_well(node, 128 + sig, "signal")
    assert st["wrapper"]["signals"] == [int(sig)]


# --------------------------------------------------------------------------- the shutdown


def test_a_failing_shutdown_is_retried_then_falls_back(tmp_path: Path) -> None:
    node = Node(tmp_path, "echo work; exit 0", shutdown_code=1)
    code, out, _ = node.run()
    assert code == 0
    assert node.noted() == ["fake-shutdown absent", "fake-shutdown absent", "fake-poweroff absent"]
    assert out.count(b"failed, try") == 2 and b"shutdown fell back to" in out
    assert node.marks()[-1] == "shutdown"


def test_when_every_shutdown_fails_the_boot_script_is_told(tmp_path: Path) -> None:
    node = Node(tmp_path, "exit 0", shutdown_code=1, fallback_code=1)
    code, _, err = node.run()
    assert code == 0 and node.status()["exit_code"] == 0
    assert len(node.noted()) == 3
    assert "shutdown" not in node.marks() and b"every way to shut the machine down failed" in err


# --------------------------------------------------------------------------- the process tree

LAUNCHER = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('worker up', flush=True); " \\
         "time.sleep(600)"
procs = [subprocess.Popen([sys.executable, "-c", worker], start_new_session=True) for _ in range(3)]
with open("pids.tmp", "w") as fh:
    fh.write(" ".join(str(p) for p in [os.getpid()] + [p.pid for p in procs]))
os.rename("pids.tmp", "pids")
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["max_duration", "signal"])
def test_a_fake_torchrun_whose_workers_ignore_term(tmp_path: Path, how: str) -> None:
    """A launcher and three workers, each in a session of its own, all ignoring TERM: every one is KILLed
    grace_s after the stop, and none outlives the wrapper."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "launcher.py").write_text(LAUNCHER)
    extra = {"max_duration_s": 2} if how == "max_duration" else {}
    node = Node(tmp_path, f"{sys.executable} launcher.py", grace_s=1, **extra)
    proc = node.start()
    pids = [int(p) for p in wait_for_file(tmp_path / "work" / "pids").split()]
    assert len(pids) == 4 and all(alive(p) for p in pids)
    if how == "signal":
        proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGKILL
    ended_well(node, 137, how)
    assert not [p for p in pids if alive(p)], "processes outlived the wrapper"
    assert "still running 1 s after the stop: killing them" in node.log_text()


def test_background_children_are_stopped_after_a_normal_end(tmp_path: Path) -> None:
    node = Node(tmp_path, "sleep 600 & echo $! > bg.pid; setsid sleep 601 & echo done; exit 0", grace_s=1)
    code, _, _ = node.run()
    assert code == 0
    ended_well(node, 0, "exited")
    pid = int((tmp_path / "work" / "bg.pid").read_text())
    assert not alive(pid)
    assert "stopping 2 process(es) it left running" in node.log_text()


TRAINER = """
import signal, sys, time
def save(*_):
    time.sleep(2.5)  # the checkpoint (25 s in the issue, scaled by 1/10 with the grace)
    open("ckpt", "w").write("saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""


def test_a_checkpoint_within_the_grace_keeps_its_exit_code(tmp_path: Path) -> None:
    """A TERM, a 2.5 s checkpoint, a 4 s grace: the trainer exits 0 on its own, 0 is recorded, and the
    shutdown comes after the save (the shutdown's note says the checkpoint file was there)."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "trainer.py").write_text(TRAINER)
    node = Node(tmp_path, f"{sys.executable} trainer.py", grace_s=4)
    node.manifest["shutdown"].append(str(tmp_path / "work" / "ckpt"))
    proc = node.start()
    assert proc.stdout is not None
    for raw in proc.stdout:
        if raw.rstrip().endswith(b"out ready"):
            break
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    ended_well(node, 0, "signal")
    assert node.noted() == ["fake-shutdown present"]


# --------------------------------------------------------------------------- bounds


def test_a_100_mb_line_in_bounded_memory(tmp_path: Path) -> None:
    node = Node(tmp_path, "head -c 100000000 /dev/zero | tr '\\0' a; echo; echo after; exit 0")
    node.manifest["logs"]["stdout"] = False
    code, _, _ = node.run(timeout=120)
    assert code == 0
    st = ended_well(node, 0, "exited")
    assert st["wrapper"]["max_rss_kb"] < 80_000, st["wrapper"]  # Python itself is ~10 MB; the line 100 MB
    assert (tmp_path / "status" / "status-0.json").stat().st_size < 64_000
    longest = 0
    with open(tmp_path / "logs" / "rank-0.log", "rb") as fh:
        for raw in fh:
            longest = max(longest, len(raw))
    assert longest < wrapper.MAX_LINE_BYTES + 100
    assert "after" in st["last_lines"]


def test_a_forged_exit_line_is_not_the_end(tmp_path: Path) -> None:
    """Lines the command prints, and one it writes straight to the wrapper's stdout (as a Vast container's
    command can), all without this attempt's nonce or not at a line's start: the broker reads the real end."""
    forge = ('printf \'x\\rLOCKSTEP-EXIT {"exit_code": 0, "reason": "exited"}\\n\'; '
             'printf \'LOCKSTEP-EXIT n0nce {"exit_code": 0, "reason": "exited"}\\n\'; '
             'printf \'\\nLOCKSTEP-EXIT {"exit_code": 0, "reason": "exited"}\\n\' > /proc/$PPID/fd/1; '
             'printf \'LOCKSTEP-EXIT other {"exit_code": 0, "reason": "exited"}\\n\' > /proc/$PPID/fd/1; exit 3')
    node = Node(tmp_path, forge)
    code, out, _ = node.run()
    assert code == 3
    ended_well(node, 3, "exited")
    text = out.decode()
    got = exit_from_log(text, "n0nce")
    assert got is not None and got.exit_code == 3
    assert exit_from_log(text, "other").exit_code == 0  # type: ignore[union-attr]  # the forged one, its own nonce
    # What the command printed stays its output (time-stamped, so never at a line's start), not an end.
    assert ("out", 'x\rLOCKSTEP-EXIT {"exit_code": 0, "reason": "exited"}') in [
        (ln.stream, ln.text) for ln in parse_log(text)]


def test_no_manifest_still_ends_with_a_status_line_and_no_hang(tmp_path: Path) -> None:
    bad = tmp_path / "manifest.json"
    bad.write_text("{not json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    proc = subprocess.run([sys.executable, str(wrapper.__file__), str(bad)], capture_output=True, timeout=30,
                          env=env)
    assert proc.returncode == wrapper.WRAPPER_FAILED
    got = exit_from_log(proc.stdout.decode())
    assert got is not None and got.exit_code == wrapper.WRAPPER_FAILED
    assert b"could not read the manifest" in proc.stderr + proc.stdout


def test_the_heartbeat_beats_while_the_command_runs(tmp_path: Path) -> None:
    node = Node(tmp_path, "sleep 1.5; exit 0")
    proc = node.start()
    beat = tmp_path / "status" / "heartbeat-0.json"
    first = json.loads(wait_for_file(beat))
    deadline = time.monotonic() + 30
    while json.loads(beat.read_text())["seq"] == first["seq"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads(beat.read_text())["seq"] > first["seq"]
    proc.communicate(timeout=30)
    ended_well(node, 0, "exited")


def test_as_pid_1_the_wrapper_reaps_orphans(tmp_path: Path) -> None:
    """In a PID namespace of its own (Vast's containers), the wrapper is PID 1: orphans of the command come to
    it and are reaped while the command runs, not left as zombies."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or not unshare:
        pytest.skip("a PID namespace needs root and util-linux's unshare (as in CI)")
    node = Node(tmp_path, "for i in $(seq 1 20); do (sleep 0.05 &); done; sleep 1; "
                          "echo zombies=$(ps -e -o stat= | grep -c '^Z'); echo me=$PPID")
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(node.manifest))
    proc = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", sys.executable, str(wrapper.__file__),
                           str(path)], capture_output=True, timeout=60, env=node.env())
    assert proc.returncode == 0, proc.stderr
    st = ended_well(node, 0, "exited")
    assert "me=1" in st["last_lines"] and "zombies=0" in st["last_lines"], st["last_lines"]


PEM = ("-----BEGIN PRIVATE KEY-----\n"
       "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
       "MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu\n"
       "NMoSfm76oqFvAp8Gy0iz5sxjZmSnXyCdPEovGhLa0VzMaQ8s+CLOyS56YyCFGeJZ\n"
       "-----END PRIVATE KEY-----")


def test_a_multi_line_secret_is_masked_line_by_line(tmp_path: Path) -> None:
    """A PEM key printed whole, with CRLF endings, and one line of it alone: no line of its body gets out."""
    node = Node(tmp_path, 'printf "%s\\n" "$KEY"; printf "%s\\n" "$KEY" | sed "s/$/\\r/"; '
                          'printf "%s\\n" "$KEY" | sed -n 3p; exit 0', secrets={"KEY": PEM})
    code, out, err = node.run()
    assert code == 0
    ended_well(node, 0, "exited")
    body = PEM.splitlines()[1:-1]
    for blob in (node.log_text(), out.decode(), err.decode(), (tmp_path / "status" / "status-0.json").read_text()):
        assert not any(line in blob for line in body)
    assert node.log_text().count(wrapper.MASK) >= 2 * len(PEM.splitlines()) + 1


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A loopback port that accepts connections and never answers (an object store black-holed by a firewall)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_a_black_holed_sink_delays_the_shutdown_by_the_end_budget_only(tmp_path: Path, black_hole: str) -> None:
    node = Node(tmp_path, "echo work; exit 0", end_upload_s=3)
    node.manifest["logs"].update({"put_urls": {"0": black_hole + "/log"}, "status_put_urls": {"0": black_hole + "/st"},
                                  "heartbeat_put_urls": {"0": black_hole + "/beat"}})
    code, _, err = node.run(timeout=45)  # the budget (3 s) and a margin, not the 365 s of five 30 s tries
    assert code == 0
    ended_well(node, 0, "exited")  # the status reached the status directory; the upload gave up
    assert b"status upload failed" in err
