"""Performance and cost model: how long a job takes on an offer, and what it costs.

Pure arithmetic with no I/O. Every function works on numpy arrays (one entry
per offer) as well as on plain floats, so the ranking evaluates thousands of
offers in one vectorised pass and the quote's explanation uses the very same
formulas for one offer.

The model, per synchronised training step (see docs/perf-model.md):

    compute  = FLOPs_step / (gpus × TFLOP/s_gpu × MFU)
    comm     = intra + inter + latency
    intra    = 2(g−1)/g × G / busbw_intra            (NVLink or PCIe, g GPUs per node)
    inter    = 2(N−1)/N × G / (fabric_GB/s × eff)    (ring over N nodes, G gradient bytes)
    latency  = 2(N−1) × buckets × α_fabric
    step     = compute + comm                        (no overlap assumed: conservative)

FLOPs come from 6·P·T (parameters × tokens) or from GPU-hours on a reference
GPU. Fabric efficiencies and latencies are calibrated on the one field fact we
hold (64 GPUs, ResNet-50: 4.2 min on InfiniBand HDR, 7.8 min on 200 GbE RoCE).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from broker.gpus import GPU_SPECS
from broker.models import Fabric, IntraNode, Workload

# Share of line rate that NCCL's ring achieves over each fabric class, and the
# per-hop latency of a small message. Calibrated: see module docstring.
FABRIC_EFFICIENCY: dict[Fabric, float] = {
    Fabric.infiniband: 0.90,
    Fabric.efa: 0.60,
    Fabric.roce: 0.30,
    Fabric.ethernet: 0.20,
    Fabric.none: 0.0,
}
FABRIC_LATENCY_US: dict[Fabric, float] = {
    Fabric.infiniband: 1.5,
    Fabric.efa: 15.0,
    Fabric.roce: 8.0,
    Fabric.ethernet: 40.0,
    Fabric.none: 1e6,
}
# Bus bandwidth of an all-reduce inside one node, GB/s.
INTRA_BUSBW_GBPS: dict[IntraNode, float] = {IntraNode.nvlink: 220.0, IntraNode.pcie: 12.0}

MFU = 0.40  # model FLOP utilisation a well-tuned dense training job reaches
BUCKET_BYTES = 25e6  # DDP's default gradient bucket
DEFAULT_BATCH_TOKENS = 4e6  # global batch for LLM pre-training when the spec does not say
DEFAULT_DOWNLOAD_GBPS = 10.0  # when an offer does not report its internet bandwidth
# The least GPU memory full-parameter training keeps per parameter: bf16 weights, fully sharded over
# the job's GPUs (ZeRO-3 / FSDP) with gradients and optimizer state elsewhere. A floor, not an estimate:
# an offer below it cannot run the job at all, however cheap its GPU-hour.
MIN_TRAIN_BYTES_PER_PARAM = 2.0


@dataclass(frozen=True, slots=True)
class StepShape:
    """What a workload asks of the hardware, independent of any offer."""

    total_flops: float  # FLOPs of the whole job (0 for services with a fixed duration)
    steps: float  # synchronised steps (0: no gradient exchange)
    grad_bytes: float  # bytes all-reduced per step
    fixed_hours: float  # services: wall-clock hours asked for


def step_shape(w: Workload) -> StepShape:
    """Reduce a workload spec to FLOPs, steps and gradient bytes."""
    if w.hours is not None and w.reference_gpu_hours is None and w.params_b is None:
        return StepShape(0.0, 0.0, 0.0, w.hours)
    params = (w.params_b or 0.0) * 1e9
    grad_bytes = params * w.grad_bytes_per_param
    if w.reference_gpu_hours is not None:
        ref = GPU_SPECS[w.reference_gpu]
        flops = w.reference_gpu_hours * 3600.0 * ref.tflops_bf16 * 1e12 * MFU
        steps = float(w.steps or 0)
    else:
        tokens = (w.tokens_b or 0.0) * 1e9
        flops = 6.0 * params * tokens
        batch = (w.global_batch_tokens_m or DEFAULT_BATCH_TOKENS / 1e6) * 1e6
        steps = float(w.steps or tokens / batch)
    return StepShape(flops, steps if grad_bytes > 0 else 0.0, grad_bytes, w.hours or 0.0)


def min_gpu_memory_gb(w: Workload, gpus: int) -> float:
    """GPU memory per GPU below which a training workload cannot run (0 when the spec gives no model size)."""
    if w.params_b is None or w.tokens_b is None:
        return 0.0
    return w.params_b * MIN_TRAIN_BYTES_PER_PARAM / max(gpus, 1)  # params_b × 1e9 × bytes / 1e9 per GB


def compute_seconds(shape: StepShape, gpus: float, tflops_per_gpu: np.ndarray | float) -> np.ndarray | float:
    return shape.total_flops / (gpus * np.maximum(tflops_per_gpu, 1e-9) * 1e12 * MFU)


def allreduce_seconds(
    grad_bytes: float,
    nodes: int,
    gpus_per_node: int,
    fabric_gbits: np.ndarray | float,
    fabric_eff: np.ndarray | float,
    fabric_latency_us: np.ndarray | float,
    intra_busbw_gbps: np.ndarray | float,
) -> np.ndarray | float:
    """Time of one gradient all-reduce (hierarchical ring: inside the node, then across nodes)."""
    if grad_bytes <= 0:
        return 0.0 * np.asarray(fabric_gbits, dtype=float)
    g, n = gpus_per_node, nodes
    intra = 0.0 if g <= 1 else 2 * (g - 1) / g * grad_bytes / (np.asarray(intra_busbw_gbps) * 1e9)
    if n <= 1:
        return intra + 0.0 * np.asarray(fabric_gbits, dtype=float)
    bw = np.maximum(np.asarray(fabric_gbits, dtype=float) / 8.0 * fabric_eff, 1e-6) * 1e9
    inter = 2 * (n - 1) / n * grad_bytes / bw
    buckets = max(1.0, grad_bytes / BUCKET_BYTES)
    latency = 2 * (n - 1) * buckets * np.asarray(fabric_latency_us) * 1e-6
    return intra + inter + latency


def preemption_overhead(hours: np.ndarray | float, rate_per_hour: np.ndarray | float,
                        checkpoint_minutes: float, restart_minutes: float = 10.0) -> np.ndarray | float:
    """Expected hours lost to preemptions: each loses half a checkpoint interval plus a restart."""
    lost_per_event_h = (checkpoint_minutes / 2.0 + restart_minutes) / 60.0
    return hours * rate_per_hour * lost_per_event_h


def transfer_hours(size_gb: float, link_gbps: np.ndarray | float) -> np.ndarray | float:
    """Hours to move the job's data over a link of the given Gbit/s."""
    if size_gb <= 0:
        return 0.0 * np.asarray(link_gbps, dtype=float)
    return size_gb * 8.0 / np.maximum(np.asarray(link_gbps, dtype=float), 0.01) / 3600.0


def job_hours(
    shape: StepShape,
    *,
    nodes: int,
    gpus_per_node: int,
    tflops_per_gpu: np.ndarray | float,
    fabric_gbits: np.ndarray | float,
    fabric_eff: np.ndarray | float,
    fabric_latency_us: np.ndarray | float,
    intra_busbw_gbps: np.ndarray | float,
) -> tuple[np.ndarray | float, np.ndarray | float]:
    """(compute hours, communication hours) of the whole job."""
    if shape.total_flops <= 0:
        zero = 0.0 * np.asarray(tflops_per_gpu, dtype=float)
        return zero + shape.fixed_hours, zero
    comp = compute_seconds(shape, nodes * gpus_per_node, tflops_per_gpu) / 3600.0
    per_step = allreduce_seconds(shape.grad_bytes, nodes, gpus_per_node, fabric_gbits, fabric_eff,
                                 fabric_latency_us, intra_busbw_gbps)
    comm = shape.steps * per_step / 3600.0
    return comp, comm
