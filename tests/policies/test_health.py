"""Health gates: datasheet throughput, fabric latency, double-bit ECC; and Perf for the ranking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.config import HealthConfig
from broker.models import Benchmark, Fabric
from broker.nccl import parse_nccl, to_benchmark
from policies.health import HealthThresholds, assess, assess_with, perf_from_benchmark

LIMITS: dict[str, Any] = {
    "min_relative_tflops": 0.7,
    "max_allreduce_latency_us": {"infiniband": 5.0, "efa": 30.0, "roce": 15.0, "ethernet": 200.0},
    "max_ecc_double_bit": 0,
}


def bench(**kw: Any) -> Benchmark:
    return Benchmark(provider="onprem", target="gpu-01", **kw)


def test_a_node_at_datasheet_speed_on_a_good_fabric_is_healthy() -> None:
    b = bench(gpu="H100-SXM", gpu_count=8, tflops_bf16=760.0, allreduce_latency_us=1.2)
    assert assess(b, gpu_model="H100-SXM", fabric=Fabric.infiniband, **LIMITS) == (True, [])


def test_throughput_far_below_the_datasheet() -> None:
    b = bench(gpu="H100-SXM", tflops_bf16=412.0)
    healthy, reasons = assess(b, gpu_model="H100-SXM", fabric=None, **LIMITS)
    assert not healthy
    [reason] = reasons
    assert "412.0 TFLOP/s" in reason and "42%" in reason and "989" in reason and "70%" in reason


def test_the_model_comes_from_the_benchmark_when_not_given() -> None:
    # a vendor spelling on the benchmark is normalised before the datasheet lookup
    b = bench(gpu="NVIDIA A100-SXM4-80GB", tflops_bf16=150.0)
    healthy, reasons = assess(b, gpu_model=None, fabric=None, **LIMITS)
    assert not healthy and "A100-SXM-80GB datasheet 312" in reasons[0]
    # an unknown model cannot be compared: no throughput verdict
    assert assess(bench(gpu="MysteryGPU", tflops_bf16=1.0), gpu_model=None, fabric=None, **LIMITS)[0]


def test_ten_microseconds_on_infiniband_is_a_misconfigured_fabric() -> None:
    b = bench(allreduce_latency_us=10.0)
    healthy, reasons = assess(b, gpu_model=None, fabric=Fabric.infiniband, **LIMITS)
    assert not healthy
    assert "10.0 µs" in reasons[0] and "5.0 µs" in reasons[0] and "infiniband" in reasons[0]
    # the same 10 µs is fine on RoCE's limit, and single-node measurements have no fabric gate
    assert assess(b, gpu_model=None, fabric=Fabric.roce, **LIMITS) == (True, [])
    assert assess(b, gpu_model=None, fabric=None, **LIMITS) == (True, [])
    # a fabric without a configured limit is not gated
    assert assess(b, gpu_model=None, fabric=Fabric.none, **LIMITS) == (True, [])


def test_double_bit_ecc_errors() -> None:
    b = bench(gpu="A100-SXM-80GB", tflops_bf16=280.0, ecc_double_bit=1)
    healthy, reasons = assess(b, gpu_model="A100-SXM-80GB", fabric=None, **LIMITS)
    assert not healthy
    assert reasons == [
        "The GPUs report 1 double-bit (uncorrectable) ECC error(s), more than the 0 allowed: "
        "results can be silently corrupt; take the node out of the pool."
    ]
    assert assess(b, gpu_model=None, fabric=None, **{**LIMITS, "max_ecc_double_bit": 1})[0]


def test_every_failed_gate_is_reported() -> None:
    b = bench(gpu="H100-SXM", tflops_bf16=300.0, allreduce_latency_us=40.0, ecc_double_bit=3)
    healthy, reasons = assess(b, gpu_model=None, fabric=Fabric.efa, **LIMITS)
    assert not healthy and len(reasons) == 3


def test_thresholds_from_the_config_section() -> None:
    cfg = HealthConfig(min_relative_tflops=0.5)
    t = HealthThresholds.of(cfg)
    assert t.min_relative_tflops == 0.5 and t.max_allreduce_latency_us["infiniband"] == 5.0
    b = bench(gpu="H100-SXM", tflops_bf16=600.0)  # 61%: fails at 0.7, passes at 0.5
    assert assess_with(b, t) == (True, [])
    assert not assess_with(b, HealthThresholds())[0]


def test_a_failed_nccl_run_carries_its_reason(shared_data: Path) -> None:
    text = (shared_data / "nccl-tests" / "a40_nvlink_pair_2gpu_nv4.txt").read_text()
    good = to_benchmark(parse_nccl(text), "onprem", "a40-node")
    assert assess_with(good, HealthThresholds(), fabric=Fabric.infiniband) == (True, [])
    broken = to_benchmark(parse_nccl(text.replace("values : 0 OK", "values : 7 FAILED")), "onprem", "a40-node")
    healthy, reasons = assess_with(broken, HealthThresholds())
    assert not healthy and "7 out-of-bounds values" in reasons[0]


def test_perf_from_benchmark() -> None:
    b = bench(gpu="H100-SXM", tflops_bf16=742.0, busbw_gbps=361.5, allreduce_latency_us=18.0,
              raw={"source": "probe"})
    perf = perf_from_benchmark(b, "H100-SXM")
    assert perf.source == "probe"
    assert perf.relative == pytest.approx(742.0 / 989.0, abs=1e-4)
    assert (perf.tflops_bf16, perf.busbw_gbps, perf.allreduce_latency_us) == (742.0, 361.5, 18.0)
    # no throughput figure (an nccl-tests run): no relative speed
    assert perf_from_benchmark(bench(busbw_gbps=47.45), "A40").relative is None
