"""What the wrapper sends over the network (issue 27): the log in parts, never the whole log again; one
uploader at a time; the status before the last part; the data input to disk in chunks. Against a real HTTP
server on loopback that keeps every request (tests/runtime/harness.py ``Sink``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime.harness import Node, Sink

PART = 16 * 1024


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink(data=bytes(range(256)) * (160 * 1024))  # 40 MiB
    yield s
    s.close()


def test_the_log_goes_up_in_parts_each_full_part_once(tmp_path: Path, sink: Sink) -> None:
    sink.delay_s = 0.02
    node = Node(tmp_path, "for r in $(seq 1 15); do seq 1 1500 | sed 's/^/row-'$r'-/'; sleep 0.1; done; exit 0")
    parts = [f"{sink.url}/log.{n}" for n in range(1, 64)]
    node.manifest["logs"].update({"stdout": False, "interval_s": 0.05, "part_bytes": PART,
                                  "put_urls": {"0": f"{sink.url}/log.0"}, "part_urls": {"0": parts},
                                  "status_put_urls": {"0": f"{sink.url}/status"}})
    code, _, err = node.run()
    assert code == 0, err
    log = (tmp_path / "logs" / "rank-0.log").read_bytes()
    assert len(log) > 8 * PART
    names = [f"/log.{n}" for n in range(64)]
    sent = [sink.puts[n] for n in names if n in sink.puts]
    assert b"".join(bodies[-1] for bodies in sent) == log  # the parts, in order, are the log
    for bodies in sent:
        assert all(len(b) <= PART for b in bodies)
        assert sum(len(b) == PART for b in bodies) <= 1  # a full part is never sent again
        assert all(bodies[-1].startswith(b) for b in bodies)  # the open part only grows
    total = sum(len(b) for bodies in sent for b in bodies)
    rounds = max(len(bodies) for bodies in sent)
    assert total <= len(log) + len(sink.order) * PART  # at most a part re-sent per PUT, never the whole log
    assert sink.most_busy == 1  # one uploader at a time
    status_at = sink.order.index("/status")
    # The status first, then the part with the log's last line (written once the status is out).
    assert any(p.startswith("/log.") for p in sink.order[status_at + 1:])
    assert b"command ended: exit code 0" in log.splitlines()[-1]
    assert rounds >= 2


def test_a_log_larger_than_its_parts_stops_shipping_not_the_command(tmp_path: Path, sink: Sink) -> None:
    node = Node(tmp_path, "seq 1 20000; exit 6")
    node.manifest["logs"].update({"stdout": False, "interval_s": 0.05, "part_bytes": 4096,
                                  "put_urls": {"0": f"{sink.url}/log.0"}, "part_urls": {"0": [f"{sink.url}/log.1"]}})
    code, _, err = node.run()
    assert code == 6 and b"outgrew its 2 upload parts" in err
    assert node.status()["exit_code"] == 6 and node.shut_down()
    assert [len(b) for b in sink.puts["/log.1"]][-1] == 4096


def test_the_data_input_is_fetched_to_disk_in_chunks(tmp_path: Path, sink: Sink) -> None:
    node = Node(tmp_path, 'cmp -s "$LOCKSTEP_DATA_PATH" expected && echo same; exit 0',
                data={"url": sink.url + "/data.bin"})
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "expected").write_bytes(sink.data)
    node.manifest["logs"]["stdout"] = False
    code, _, err = node.run()
    assert code == 0, err
    st = node.status()
    assert "same" in st["last_lines"]
    assert st["wrapper"]["max_rss_kb"] < 35_000, st["wrapper"]  # a 40 MiB download, not held in memory
