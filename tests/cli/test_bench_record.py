"""`lockstep bench record` / `bench list` on the local store: real nccl-tests output and a real probe document,
the health gates' verdict, and one-line errors (exit 2) for bad input. No cluster needed: the providers named
here are not configured, so an unhealthy target is marked out of the pool but not drained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.probe import run_probe


@pytest.fixture(scope="module")
def probe_doc() -> dict:
    return run_probe(quick=True)  # this machine, really measured (no GPU here: host and disk figures)


def test_record_nccl_output_and_list(invoke, shared_data: Path) -> None:
    log = shared_data / "nccl-tests" / "dgx_a100_nvswitch_4gpu.txt"
    code, out, err = invoke("bench", "record", str(log), "--provider", "catalog", "--target", "dgx-a100", "--nccl",
                            "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["target"], doc["source"], doc["healthy"]) == ("dgx-a100", "nccl-tests", True)
    assert doc["busbw_gbps"] == 222.066  # the printed "Avg bus bandwidth"

    code, out, err = invoke("bench", "list", "--json")
    assert code == 0, err
    listed = json.loads(out)
    assert [(b["provider"], b["target"], b["busbw_gbps"]) for b in listed["benchmarks"]] == [
        ("catalog", "dgx-a100", 222.066)
    ]
    assert listed["unhealthy"] == []
    code, out, _ = invoke("bench", "list")
    assert code == 0 and "dgx-a100" in out and "healthy" in out


def test_record_probe_with_ecc_errors_marks_the_node_unhealthy(invoke, probe_doc: dict, tmp_path: Path) -> None:
    # What nvidia-smi reports for a GPU with uncorrectable errors, added to a real probe document.
    doc = dict(probe_doc, nvidia_smi={"available": True, "gpus": [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "ecc_double_bit": 3},
    ]})
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    code, out, err = invoke("bench", "record", str(path), "--provider", "vast", "--target", "host-7", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["healthy"] is False and "3 double-bit" in got["reason"] and got["gpu"] == "H100-SXM"
    assert got["drain"] == {"drained": False, "why": "provider not configured"}

    code, out, err = invoke("bench", "list", "--json")
    listed = json.loads(out)
    assert listed["unhealthy"] == [{"provider": "vast", "node": "host-7", "reason": listed["unhealthy"][0]["reason"]}]
    assert listed["unhealthy"][0]["reason"].startswith("lockstep health: ")
    code, out, _ = invoke("bench", "list")
    assert "out of the pool" in out and "vast/host-7" in out

    code, out, err = invoke("bench", "resume", "host-7", "--provider", "vast")
    assert code == 0 and "back in the pool" in out, err
    assert json.loads(invoke("bench", "list", "--json")[1])["unhealthy"] == []


def test_record_latency_gate_needs_the_fabric(invoke, shared_data: Path, tmp_path: Path) -> None:
    # The DGX run starts at 1 GiB: no small messages, so no latency to judge even with a fabric.
    log = shared_data / "nccl-tests" / "dgx_a100_nvswitch_4gpu.txt"
    code, out, err = invoke("bench", "record", str(log), "--provider", "catalog", "--target", "x", "--nccl",
                            "--fabric", "infiniband", "--json")
    assert code == 0, err
    assert json.loads(out)["healthy"] is True and json.loads(out)["fabric"] == "infiniband"


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ("not json at all", [], "not JSON"),
        ('{"hello": 1}', [], "not a probe document"),
        ("garbage", ["--nccl"], "no result rows"),
        ('{"hello": 1}', ["--fabric", "carrier-pigeon"], "--fabric 'carrier-pigeon'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(invoke, tmp_path: Path, content: str, extra: list[str], message: str) -> None:
    path = tmp_path / "input.txt"
    path.write_text(content, encoding="utf-8")
    code, out, err = invoke("bench", "record", str(path), "--provider", "p", "--target", "t", *extra)
    assert code == 2 and message in err, (code, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    code, out, _ = invoke("bench", "list", "--json")
    assert json.loads(out)["benchmarks"] == []  # nothing stored


def test_missing_file_and_unconfigured_burnin(invoke, tmp_path: Path) -> None:
    code, _, err = invoke("bench", "record", str(tmp_path / "nope.json"), "--provider", "p", "--target", "t")
    assert code == 2 and "no such file" in err and len(err.strip().splitlines()) == 1
    code, _, err = invoke("burnin", "gpu-node1", "--provider", "slurm")
    assert code == 2 and "not configured" in err and len(err.strip().splitlines()) == 1
