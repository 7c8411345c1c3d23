"""Health gates over benchmarks: pure functions, no I/O, no clock.

A node is unhealthy when

- its measured matmul throughput is far below its GPU model's datasheet
  (throttling, a bad PCIe link, a wrong driver: it will slow every rank of a
  synchronous job to its pace);
- its small-message all-reduce latency is far above its fabric class (about
  1 µs on NDR InfiniBand is right; 10 µs means a misconfigured fabric);
- it reports double-bit (uncorrectable) ECC errors: such a GPU silently
  corrupts work and must leave the pool.

The latency gate applies to measurements that crossed the inter-node fabric:
pass ``fabric=None`` for a single-node measurement (NVLink/PCIe only).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.gpus import GPU_SPECS, normalise_gpu
from broker.models import Benchmark, Fabric, Perf

__all__ = ["HealthThresholds", "assess", "assess_with", "datasheet_model", "perf_from_benchmark"]


def _default_latency() -> dict[str, float]:
    return {"infiniband": 5.0, "efa": 30.0, "roce": 15.0, "ethernet": 200.0}


@dataclass(frozen=True)
class HealthThresholds:
    """The gates' limits; the same fields as broker.config.HealthConfig (see `of`)."""

    min_relative_tflops: float = 0.7
    max_allreduce_latency_us: Mapping[str, float] = field(default_factory=_default_latency)
    max_ecc_double_bit: int = 0

    @classmethod
    def of(cls, config: Any) -> HealthThresholds:
        """From any object with the three fields (broker.config.HealthConfig)."""
        return cls(
            min_relative_tflops=float(config.min_relative_tflops),
            max_allreduce_latency_us=dict(config.max_allreduce_latency_us),
            max_ecc_double_bit=int(config.max_ecc_double_bit),
        )


def datasheet_model(b: Benchmark, gpu_model: str | None) -> str | None:
    """The canonical GPU model to compare with: the one given, else the benchmark's own."""
    for name in (gpu_model, b.gpu):
        if name:
            canon = name if name in GPU_SPECS else normalise_gpu(name)
            if canon is not None:
                return canon
    return None


def _relative(b: Benchmark, model: str | None) -> float | None:
    if model is None or b.tflops_bf16 is None:
        return None
    return b.tflops_bf16 / GPU_SPECS[model].tflops_bf16


def assess(
    b: Benchmark,
    *,
    gpu_model: str | None,
    fabric: Fabric | None,
    min_relative_tflops: float,
    max_allreduce_latency_us: Mapping[str, float],
    max_ecc_double_bit: int,
) -> tuple[bool, list[str]]:
    """(healthy, reasons): healthy exactly when no gate failed; one readable sentence per failure."""
    reasons: list[str] = []
    if not b.healthy and b.reason:
        reasons.append(f"The benchmark itself failed: {b.reason}.")

    model = datasheet_model(b, gpu_model)
    rel = _relative(b, model)
    if rel is not None and model is not None and rel < min_relative_tflops:
        spec = GPU_SPECS[model]
        reasons.append(
            f"GPU throughput {b.tflops_bf16:.1f} TFLOP/s (bf16) is {rel:.0%} of the {model} datasheet "
            f"{spec.tflops_bf16:.0f} TFLOP/s, below the {min_relative_tflops:.0%} minimum."
        )

    if fabric is not None and b.allreduce_latency_us is not None:
        limit = max_allreduce_latency_us.get(Fabric(fabric).value)
        if limit is not None and b.allreduce_latency_us > limit:
            reasons.append(
                f"Small-message all-reduce latency {b.allreduce_latency_us:.1f} µs is above the "
                f"{limit:.1f} µs limit for {Fabric(fabric).value}: the fabric is likely misconfigured "
                f"(about 1 µs is right on NDR InfiniBand, 10 µs is not)."
            )

    if b.ecc_double_bit > max_ecc_double_bit:
        reasons.append(
            f"The GPUs report {b.ecc_double_bit} double-bit (uncorrectable) ECC error(s), more than the "
            f"{max_ecc_double_bit} allowed: results can be silently corrupt; take the node out of the pool."
        )
    return not reasons, reasons


def assess_with(
    b: Benchmark, thresholds: HealthThresholds, *, gpu_model: str | None = None, fabric: Fabric | None = None
) -> tuple[bool, list[str]]:
    """`assess` with the limits taken from a HealthThresholds."""
    return assess(
        b,
        gpu_model=gpu_model,
        fabric=fabric,
        min_relative_tflops=thresholds.min_relative_tflops,
        max_allreduce_latency_us=thresholds.max_allreduce_latency_us,
        max_ecc_double_bit=thresholds.max_ecc_double_bit,
    )


def perf_from_benchmark(b: Benchmark, gpu_model: str | None) -> Perf:
    """What the ranking needs from a benchmark; relative = measured TFLOP/s over the datasheet."""
    rel = _relative(b, datasheet_model(b, gpu_model))
    return Perf(
        source=str(b.raw.get("source") or "benchmark"),
        tflops_bf16=b.tflops_bf16,
        busbw_gbps=b.busbw_gbps,
        allreduce_latency_us=b.allreduce_latency_us,
        relative=round(rel, 4) if rel is not None else None,
    )
