"""The node probe runs as a bare script (standard library only) and prints one JSON document.

This machine has no GPU and no PyTorch: the probe must still measure host, CPU,
memory and disk, and say why there are no GPU figures. The GPU paths run on
GPU nodes (`python probe.py` there); here they are covered by the document shape.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.models import Benchmark
from broker.probe import benchmark_from_probe, run_probe

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "broker" / "probe.py"


def _check_host_figures(doc: dict[str, Any]) -> None:
    assert doc["probe_version"] >= 1
    assert doc["host"]["hostname"] and doc["host"]["python"]
    assert doc["cpu"]["count"] >= 1 and doc["cpu"]["model"]
    assert doc["memory"]["total_gb"] > 0
    disk = doc["disk"]
    assert disk["write_mbps"] > 0 and disk["read_mbps"] > 0
    assert disk["size_mb"] > 0
    assert "fstype" in disk and "device" in disk  # what the figure was measured on


@pytest.fixture(scope="module")
def bare_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """probe.py copied alone into an empty directory, run with no site-packages (-S) and no
    project on the path (-I): proof that it needs nothing but the standard library."""
    where = tmp_path_factory.mktemp("bare-probe")
    shutil.copy(PROBE, where / "probe.py")
    disk_dir = where / "disk"
    disk_dir.mkdir()
    out = subprocess.run(
        [sys.executable, "-I", "-S", "probe.py", "--quick", "--disk-dir", str(disk_dir)],
        cwd=where, capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), disk_dir  # one JSON document, nothing else on stdout


def test_bare_script_prints_one_json_document(bare_run: tuple[dict[str, Any], Path]) -> None:
    doc, _ = bare_run
    _check_host_figures(doc)
    assert doc["quick"] is True


def test_bare_script_without_torch_says_why_there_are_no_gpus(bare_run: tuple[dict[str, Any], Path]) -> None:
    doc, _ = bare_run
    assert doc["gpus"] == []
    assert "PyTorch is not installed" in doc["gpu_note"]
    assert isinstance(doc["nvidia_smi"]["available"], bool)


def test_disk_test_leaves_no_file_behind(bare_run: tuple[dict[str, Any], Path]) -> None:
    doc, disk_dir = bare_run
    assert doc["disk"]["path"] == str(disk_dir)
    assert list(disk_dir.iterdir()) == []


def test_module_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "broker.probe", "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    _check_host_figures(json.loads(out.stdout))


def test_run_probe_in_process_and_as_benchmark(tmp_path: Path) -> None:
    doc = run_probe(quick=True, disk_dir=str(tmp_path))
    _check_host_figures(doc)
    bench = benchmark_from_probe(doc, "onprem", "")
    assert isinstance(bench, Benchmark)
    assert bench.target == doc["host"]["hostname"]
    assert bench.disk_write_mbps == doc["disk"]["write_mbps"] > 0
    assert bench.gpu_count == len(doc["gpus"])
    assert bench.raw["source"] == "probe"


def test_benchmark_from_a_gpu_probe_document_takes_the_weakest_gpu() -> None:
    # The shape `python probe.py` prints on a two-GPU node (figures of an H100 SXM pair).
    doc = {
        "host": {"hostname": "gpu-7"},
        "disk": {"write_mbps": 1800.0, "read_mbps": 2500.0},
        "gpus": [
            {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_gb": 85.0, "tflops_bf16": 712.4,
             "mem_bw_gbps": 2950.0, "h2d_gbps": 52.1, "ecc_double_bit": 0, "driver_version": "550.54.15"},
            {"index": 1, "name": "NVIDIA H100 80GB HBM3", "memory_gb": 85.0, "tflops_bf16": 388.0,
             "mem_bw_gbps": 2990.0, "h2d_gbps": 51.7, "ecc_double_bit": 2, "driver_version": "550.54.15"},
        ],
        "nccl": {"ranks": 2, "busbw_gbps": 361.5, "latency_us": 18.2},
    }
    bench = benchmark_from_probe(doc, "vast", "contract-123")
    assert bench.gpu == "H100-SXM" and bench.gpu_count == 2
    assert bench.tflops_bf16 == 388.0 and bench.mem_bw_gbps == 2950.0 and bench.h2d_gbps == 51.7
    assert bench.ecc_double_bit == 2
    assert bench.busbw_gbps == 361.5 and bench.allreduce_latency_us == 18.2


def test_benchmark_from_a_probe_without_torch_keeps_nvidia_smi_ecc_counts() -> None:
    # torch absent, nvidia-smi present: no throughput, but the double-bit ECC count must not be lost
    doc = {
        "host": {"hostname": "a100-3"},
        "gpus": [],
        "gpu_note": "PyTorch is not installed: no GPU throughput measured (nvidia-smi sees 2 GPU(s))",
        "nvidia_smi": {"available": True, "gpus": [
            {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "ecc_double_bit": 0},
            {"index": 1, "name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "ecc_double_bit": 4},
        ]},
    }
    bench = benchmark_from_probe(doc, "onprem", "")
    assert (bench.gpu, bench.gpu_count, bench.ecc_double_bit) == ("A100-SXM-40GB", 2, 4)
    assert bench.tflops_bf16 is None and bench.target == "a100-3"
