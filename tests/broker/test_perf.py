"""The performance model, checked against the field facts in DESIGN.md."""

from __future__ import annotations

from broker.gpus import GPU_SPECS
from broker.models import Fabric, IntraNode, Workload
from broker.perf import (
    FABRIC_EFFICIENCY,
    FABRIC_LATENCY_US,
    INTRA_BUSBW_GBPS,
    allreduce_seconds,
    job_hours,
    step_shape,
)

# ResNet-50 (25.6 M parameters, fp32 gradients) on 64 A100s as 8 nodes × 8,
# the workload the calibration fact describes (see docs/perf-model.md).
RESNET = Workload(reference_gpu_hours=2.39, reference_gpu="A100-SXM-80GB", params_b=0.0256,
                  grad_bytes_per_param=4, steps=13250)


def minutes_on(fabric: Fabric, gbits: float, nodes: int = 8, workload: Workload = RESNET) -> float:
    comp, comm = job_hours(
        step_shape(workload), nodes=nodes, gpus_per_node=8,
        tflops_per_gpu=GPU_SPECS["A100-SXM-80GB"].tflops_bf16, fabric_gbits=gbits,
        fabric_eff=FABRIC_EFFICIENCY[fabric], fabric_latency_us=FABRIC_LATENCY_US[fabric],
        intra_busbw_gbps=INTRA_BUSBW_GBPS[IntraNode.nvlink],
    )
    return float(comp + comm) * 60


def test_resnet50_64gpus_infiniband_hdr_vs_roce_200g() -> None:
    ib = minutes_on(Fabric.infiniband, 200)
    roce = minutes_on(Fabric.roce, 200)
    assert abs(ib - 4.2) / 4.2 < 0.05, ib
    assert abs(roce - 7.8) / 7.8 < 0.05, roce


def test_ring_allreduce_volume_formula() -> None:
    # 2(n-1)/n × bytes / bandwidth, no latency, single GPU per node.
    t = allreduce_seconds(1e9, nodes=4, gpus_per_node=1, fabric_gbits=80.0, fabric_eff=1.0,
                          fabric_latency_us=0.0, intra_busbw_gbps=100.0)
    assert abs(float(t) - 2 * 3 / 4 * 1e9 / 10e9) < 1e-9


def test_more_gpus_over_a_slow_network_can_be_slower() -> None:
    # Same job: 2 nodes vs 8 nodes on 1 GbE. Communication dominates; adding nodes does not pay.
    chatty = Workload(reference_gpu_hours=2.0, params_b=1.0, steps=5000)
    two = minutes_on(Fabric.ethernet, 1, nodes=2, workload=chatty)
    eight = minutes_on(Fabric.ethernet, 1, nodes=8, workload=chatty)
    assert eight > two * 0.95


def test_llm_flops_6pt() -> None:
    s = step_shape(Workload(params_b=70, tokens_b=20, global_batch_tokens_m=4))
    assert s.total_flops == 6 * 70e9 * 20e9
    assert s.steps == 20e9 / 4e6
    assert s.grad_bytes == 70e9 * 2


def test_service_hours_are_fixed() -> None:
    comp, comm = job_hours(step_shape(Workload(hours=168)), nodes=1, gpus_per_node=2, tflops_per_gpu=100.0,
                           fabric_gbits=0.0, fabric_eff=0.0, fabric_latency_us=0.0, intra_busbw_gbps=12.0)
    assert float(comp) == 168 and float(comm) == 0
