"""The nccl-tests parser against four real outputs and synthetic variants of other versions."""
# The synthetic outputs keep nccl-tests' own column widths, wider than our line length:
# ruff: noqa: E501

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.errors import SpecError
from broker.models import Benchmark
from broker.nccl import NcclResult, parse_nccl, small_message_latency_us, to_benchmark

REAL = {
    "a40_nvlink_pair_2gpu_nv4.txt": 47.45,
    "a40_node_boundary_2gpu_p2p_disabled.txt": 3.86,
    "a40_sys_boundary_4gpu_p2p_disabled.txt": 1.40,
    "dgx_a100_nvswitch_4gpu.txt": 222.07,
}


def _real(shared_data: Path, name: str) -> NcclResult:
    return parse_nccl((shared_data / "nccl-tests" / name).read_text())


def _row(result: NcclResult, size: int, in_place: bool) -> tuple[float, float, float]:
    [row] = [r for r in result.rows if r.size_bytes == size and r.in_place is in_place]
    return row.time_us, row.algbw_gbps, row.busbw_gbps


# --------------------------------------------------------------------------- real outputs


@pytest.mark.parametrize(("name", "avg"), sorted(REAL.items()))
def test_real_outputs_average(shared_data: Path, name: str, avg: float) -> None:
    result = _real(shared_data, name)
    assert round(result.avg_busbw_gbps, 2) == avg
    assert result.collective == "all_reduce"  # from the command line in the file's comment
    # four sizes, 1 GiB to 8 GiB, each measured out-of-place and in-place
    assert [r.size_bytes for r in result.rows] == [2**30, 2**30, 2**31, 2**31, 2**32, 2**32, 2**33, 2**33]
    assert [r.in_place for r in result.rows] == [False, True] * 4
    assert all(r.type == "float" and r.redop == "sum" and r.root == -1 and r.wrong == 0 for r in result.rows)
    assert result.out_of_bounds == 0 and not result.errors_found
    # nccl-tests' average is the mean over all rows; the printed figures are rounded to 2 decimals
    assert result.mean_busbw_gbps == pytest.approx(result.avg_busbw_gbps, abs=0.01)


def test_real_rows_exactly_as_printed(shared_data: Path) -> None:
    dgx = _real(shared_data, "dgx_a100_nvswitch_4gpu.txt")
    assert _row(dgx, 1073741824, False) == (7163.5, 149.89, 224.84)
    assert _row(dgx, 1073741824, True) == (7161.8, 149.93, 224.89)
    assert _row(dgx, 4294967296, True) == (39252.0, 109.42, 164.13)  # the in-place dip, as printed
    assert dgx.rows[0].count == 268435456

    nv4 = _real(shared_data, "a40_nvlink_pair_2gpu_nv4.txt")
    assert _row(nv4, 8589934592, False) == (180860.0, 47.49, 47.49)
    assert _row(nv4, 2147483648, True) == (45276.0, 47.43, 47.43)

    sys4 = _real(shared_data, "a40_sys_boundary_4gpu_p2p_disabled.txt")
    # 4 ranks: busbw = algbw × 2(n-1)/n = 1.5 × algbw
    assert _row(sys4, 1073741824, False) == (1121937.0, 0.96, 1.44)
    assert _row(sys4, 8589934592, True) == (9550375.0, 0.90, 1.35)

    node = _real(shared_data, "a40_node_boundary_2gpu_p2p_disabled.txt")
    assert _row(node, 1073741824, True) == (268167.0, 4.00, 4.00)


def test_real_json_contract(shared_data: Path) -> None:
    doc = _real(shared_data, "a40_nvlink_pair_2gpu_nv4.txt").to_json_dict()
    json.dumps(doc)  # JSON-ready
    assert doc["avg_busbw_gbps"] == 47.4509
    assert len(doc["rows"]) == 8
    for row in doc["rows"]:
        assert {"size_bytes", "time_us", "algbw_gbps", "busbw_gbps", "in_place"} <= row.keys()
        assert isinstance(row["in_place"], bool) and isinstance(row["size_bytes"], int)
    first = {k: doc["rows"][0][k] for k in ("size_bytes", "time_us", "algbw_gbps", "busbw_gbps", "in_place")}
    assert first == {
        "size_bytes": 1073741824,
        "time_us": 22661.0,
        "algbw_gbps": 47.38,
        "busbw_gbps": 47.38,
        "in_place": False,
    }


def test_large_only_runs_have_no_small_message_latency(shared_data: Path) -> None:
    result = _real(shared_data, "dgx_a100_nvswitch_4gpu.txt")
    # 1 GiB messages measure bandwidth, not latency
    assert small_message_latency_us(result) is None
    assert small_message_latency_us(result, max_size_bytes=None) == 7161.8
    bench = to_benchmark(result, "onprem", "dgx-a100-01")
    assert isinstance(bench, Benchmark)
    assert bench.busbw_gbps == 222.066 and bench.allreduce_latency_us is None
    assert bench.healthy and bench.raw["source"] == "nccl-tests"


# --------------------------------------------------------------------------- synthetic variants

# Current layout (nccl-tests 2.13+): header lines, Rank lines, small sizes, NCCL INFO noise, Open MPI tags.
MODERN = """\
# nccl-tests version 2.13.9 nccl-headers=21903 nccl-library=21903
# Collective test starting: all_reduce_perf_mpi
# nThread 1 nGpus 1 minBytes 8 maxBytes 1048576 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  41721 on gpu-node-1 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  41722 on gpu-node-1 device  1 [0000:2a:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid  51001 on gpu-node-2 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid  51002 on gpu-node-2 device  1 [0000:2a:00] NVIDIA H100 80GB HBM3
gpu-node-1:41721:41721 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
gpu-node-1:41721:41721 [0] NCCL INFO NCCL version 2.19.3+cuda12.3
[1,2]<stderr>:gpu-node-2:51001:51090 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.2<0>
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
[1,0]<stdout>:           8             2     float     sum      -1    21.43    0.00    0.00      0    20.87    0.00    0.00      0
gpu-node-1:41721:41730 [0] NCCL INFO comm 0x55d1 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0
          16             4     float     sum      -1    21.90    0.00    0.00      0    21.71    0.00    0.00      0
     1048576        262144     float     sum      -1    48.11   21.79   32.69      0    47.95   21.87   32.80      0
--------------------------------------------------------------------------
WARNING: There was an error initializing an OpenFabrics device.
--------------------------------------------------------------------------
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 10.9162
#
# Collective test concluded: all_reduce_perf_mpi
"""


def test_modern_layout_with_noise_and_devices() -> None:
    result = parse_nccl(MODERN)
    assert result.collective == "all_reduce"
    assert result.nranks == 4
    assert [d.host for d in result.devices] == ["gpu-node-1", "gpu-node-1", "gpu-node-2", "gpu-node-2"]
    assert result.devices[3].pci == "0000:2a:00" and result.devices[3].name == "NVIDIA H100 80GB HBM3"
    assert result.nccl_version == "2.19.3+cuda12.3"
    assert result.avg_busbw_gbps == 10.9162
    assert len(result.rows) == 6
    assert _row(result, 8, False) == (21.43, 0.0, 0.0)
    assert _row(result, 1048576, True) == (47.95, 21.87, 32.80)
    assert small_message_latency_us(result) == 20.87  # the better of the two 8-byte times

    bench = to_benchmark(result, "slurm", "gpu-node-[1-2]")
    assert bench.gpu == "H100-SXM" and bench.gpu_count == 4
    assert bench.allreduce_latency_us == 20.87 and bench.busbw_gbps == 10.9162
    assert bench.raw["rows"][0]["size_bytes"] == 8


# Older nccl-tests (before 2.10): no root column, an `error` column printing floats.
OLD_NO_ROOT = """\
# nThread 1 nGpus 8 minBytes 8 maxBytes 128 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2   float     sum    38.87    0.00    0.00  1e-07    38.46    0.00    0.00  0e+00
          64            16   float     sum    39.20    0.00    0.00  2e-07    38.95    0.00    0.00  1e-07
         128            32   float     sum    39.53    0.00    0.01  0e+00    39.07    0.00    0.01  0e+00
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.00333
"""


def test_old_layout_without_root_and_float_errors() -> None:
    result = parse_nccl(OLD_NO_ROOT)
    assert result.nranks == 8  # nThread × nGpus of the single process
    assert all(r.root is None and r.redop == "sum" for r in result.rows)
    assert [r.wrong for r in result.rows[:2]] == [1e-07, 0.0]
    assert _row(result, 128, False) == (39.53, 0.0, 0.01)
    assert result.avg_busbw_gbps == 0.00333
    # an old `error` column is a max error (1e-07 is float rounding), not a count of wrong elements:
    # only the out-of-bounds count says whether the run failed
    assert not result.errors_are_counts and not result.errors_found
    failed = parse_nccl(OLD_NO_ROOT.replace("values : 0 OK", "values : 2 FAILED"))
    assert failed.errors_found and not to_benchmark(failed, "aws", "p4d").healthy


# all_gather of an old version: neither redop nor root; validation off prints N/A.
OLD_ALLGATHER_NA = """\
#                                             out-of-place                       in-place
#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024            32   float    12.50    0.08    0.07    N/A    12.10    0.08    0.07    N/A
     1048576         32768   float    45.00   23.30   20.39    N/A    44.80   23.41   20.48    N/A
"""


def test_no_redop_no_root_and_na_errors() -> None:
    result = parse_nccl(OLD_ALLGATHER_NA)
    assert all(r.redop is None and r.root is None and r.wrong is None for r in result.rows)
    assert _row(result, 1048576, True) == (44.8, 23.41, 20.48)
    assert not result.errors_found
    # no summary line: the JSON average is the mean of the rows, and says so
    assert result.avg_busbw_gbps is None
    doc = result.to_json_dict()
    assert doc["avg_busbw_gbps"] == pytest.approx((0.07 + 0.07 + 20.39 + 20.48) / 4)
    assert doc["avg_busbw_source"] == "rows"


# No header at all (a pasted excerpt), srun -l rank prefixes, a broadcast with root 0, wrong elements.
HEADERLESS_SRUN = """\
0: + srun ./build/broadcast_perf -b 8 -e 16
0:            8             2     float    none       0    10.11    0.00    0.00      0    10.02    0.00    0.00      0
0:           16             4     float    none       0    10.31    0.00    0.00      3    10.20    0.00    0.00      0
0: # Out of bounds values : 3 FAILED
"""


def test_headerless_prefixed_rows_with_wrong_elements() -> None:
    result = parse_nccl(HEADERLESS_SRUN)
    assert result.collective == "broadcast"
    assert [(r.redop, r.root) for r in result.rows] == [("none", 0)] * 4
    assert result.rows[2].wrong == 3 and result.out_of_bounds == 3 and result.errors_found
    bench = to_benchmark(result, "vast", "host-9")
    assert bench.allreduce_latency_us is None  # a broadcast says nothing of all-reduce latency
    assert not bench.healthy and "3 wrong elements" in bench.reason


# Per-iteration timing (-I) adds four columns per half; -T a trailing timestamp; big times in %e.
PER_ITER_TIMESTAMP = """\
#                                   out-of-place (+ per-iteration)                                in-place (+ per-iteration)
#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%           timestamp
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)     (us)     (us)      (%)     (us)  (GB/s)  (GB/s)             (us)     (us)     (us)      (%) %Y-%m-%d %H:%M:%S
           8             2     float     sum      -1    11.02    0.00    0.00       0    10.50    12.00    11.90     2.10    10.95    0.00    0.00       0    10.40    11.80    11.70     2.00 2025-03-01 10:00:00
 17179869184    4294967296     float     sum      -1  1.2e+05  143.17  250.55       0  1.1e+05  1.3e+05  1.3e+05     1.00  1.2e+05  143.10  250.42       0  1.1e+05  1.3e+05  1.3e+05     1.10 2025-03-01 10:00:05
# Avg bus bandwidth    : 125.243
"""


def test_per_iteration_columns_and_timestamps() -> None:
    result = parse_nccl(PER_ITER_TIMESTAMP)
    assert len(result.rows) == 4
    assert _row(result, 8, True) == (10.95, 0.0, 0.0)
    assert _row(result, 17179869184, False) == (120000.0, 143.17, 250.55)
    assert small_message_latency_us(result) == 10.95


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("   \n\n", "empty"),
        ("NCCL WARN connect failed\nsegmentation fault\n", "no result rows"),
        ("# Avg bus bandwidth : 12.5\n", "no result rows"),
        ("#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
         "     8     2  float  sum  -1  10.0  0.00\n", "line 2: expected 8 measurement columns"),
        ("     8     2  float  sum  -1  10.0  fast  0.00  0  10.0  0.00  0.00  0\n", "line 1: algbw 'fast'"),
    ],
)
def test_bad_input_is_a_spec_error(text: str, needle: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_nccl(text)
    assert needle in str(info.value)


def test_two_tables_in_one_file_are_refused(shared_data: Path) -> None:
    one = (shared_data / "nccl-tests" / "dgx_a100_nvswitch_4gpu.txt").read_text()
    with pytest.raises(SpecError, match="second result table"):
        parse_nccl(one + one)
