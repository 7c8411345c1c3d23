"""`lockstep bench record` of a probe that saw no GPU: recorded unhealthy with the reason, and out of the pool.

The document is this machine's real probe (no GPU here), so the test measures what a GPU node with a dead
driver would report: no torch device and no nvidia-smi GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

from broker.probe import run_probe


def test_record_of_a_probe_with_no_gpu_is_unhealthy(invoke, tmp_path: Path) -> None:
    doc = run_probe(quick=True, disk_dir=str(tmp_path))
    doc.update(gpus=[], nvidia_smi={"available": False})  # what a GPU node whose driver is gone reports
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    code, out, err = invoke("bench", "record", str(path), "--provider", "vast", "--target", "host-0", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["healthy"] is False and got["gpu_count"] == 0
    assert "the probe found no GPU" in got["reason"]
    listed = json.loads(invoke("bench", "list", "--json")[1])
    assert [(u["provider"], u["node"]) for u in listed["unhealthy"]] == [("vast", "host-0")]
