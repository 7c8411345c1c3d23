"""A property of the in-job wrapper (issue 27): failures injected at every I/O call it makes — the log file,
stdout, uploads, the status, the heartbeat, unpacking, the data download, starting the command, the shutdown
itself — and in every run the machine is shut down (the shutdown command, or its fallback when the shutdown
failed), the wrapper ends, and no process of the job is left.

The failures come from the wrapper's own fault points (``LOCKSTEP_TEST_FAULTS``: the n-th call at a point
raises ``OSError(EIO)``), in a real wrapper process talking to a real HTTP server on loopback.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.runtime.harness import Node, Sink, alive

POINTS = ["log_open", "log_write", "stdout", "upload", "http", "status_write", "status_put", "heartbeat",
          "unpack", "fetch", "mkdir", "spawn"]


def files_blob() -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"print('from a file')\n"
        info = tarfile.TarInfo("job.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def sink() -> Iterator[Sink]:
    s = Sink(data=b"x" * 300_000)
    yield s
    s.close()


faults = st.fixed_dictionaries({}, optional={
    **{p: st.sets(st.integers(0, 6), max_size=4).map(sorted) for p in POINTS},
    # the shutdown fails at most on its first try: then its retry, or the fallback, runs
    "shutdown": st.just([0]),
})


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=faults)
def test_the_machine_is_shut_down_whatever_fails(tmp_path_factory: pytest.TempPathFactory, sink: Sink,
                                                 plan: dict[str, list[int]]) -> None:
    root = tmp_path_factory.mktemp("faults")
    node = Node(root, "python3 job.py; for i in 1 2 3; do echo line-$i; echo err-$i >&2; done; "
                      "sleep 60 & echo $! > bg.pid; exit 3",
                files=files_blob(), data={"url": sink.url + "/data.bin"}, grace_s=0.3)
    node.manifest["logs"].update({
        "put_urls": {"0": f"{sink.url}/{root.name}/log"}, "part_urls": {"0": [f"{sink.url}/{root.name}/log.1"]},
        "part_bytes": 2048, "status_put_urls": {"0": f"{sink.url}/{root.name}/status"},
        "heartbeat_put_urls": {"0": f"{sink.url}/{root.name}/beat"}})
    code, out, err = node.run(timeout=120, env={"LOCKSTEP_TEST_FAULTS": json.dumps(plan)})
    assert node.shut_down(), (plan, err.decode()[-2000:])
    assert b"LOCKSTEP-EXIT n0nce " in out or "stdout" in plan
    assert code in (3, 127), (plan, code, err.decode()[-2000:])
    pid_file = root / "work" / "bg.pid"
    if pid_file.exists() and pid_file.read_text().strip():
        assert not alive(int(pid_file.read_text()))
