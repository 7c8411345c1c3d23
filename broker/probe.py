"""Node probe: measure what a rented or owned node really delivers, print one JSON document.

Runs anywhere Python 3.9+ runs: `python probe.py [--quick]` copied alone onto a
node, or `python -m broker.probe` from the package. Only the standard library
is imported at import time, so the file can be shipped by itself; PyTorch is
used when importable, for the GPU measurements:

- per GPU: dense bf16 and fp16 matmul TFLOP/s (large square matmuls, warm-up,
  timed with CUDA events), device memory bandwidth (device-to-device copy,
  read + write counted, as CUDA's bandwidthTest does), pinned host↔device
  bandwidth;
- with two GPUs or more: NCCL all-reduce bus bandwidth (busbw = algbw ×
  2(n−1)/n, as nccl-tests reports it) and small-message latency, one spawned
  process per GPU through torch.distributed;
- double-bit (uncorrected) ECC error counts from nvidia-smi when it exists.

Without torch or a GPU it still measures host, CPU, RAM and disk, and says why
there are no GPU figures (`"gpus": []`, `"gpu_note"`). Every figure carries the
device and driver it was measured on. Units: GB/s and TFLOP/s with G/T = 1e9 /
1e12, disk MB/s with MB = 1e6 bytes.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from typing import Any

PROBE_VERSION = 1

# Sizes per mode: quick must finish in seconds on a CPU-only CI runner.
_SIZES = {
    True: {"disk_mb": 16, "matmul_n": 4096, "matmul_iters": 10, "copy_mb": 256, "h2d_mb": 64, "nccl_mb": 32},
    False: {"disk_mb": 1024, "matmul_n": 8192, "matmul_iters": 50, "copy_mb": 1024, "h2d_mb": 256, "nccl_mb": 256},
}
_NCCL_TIMEOUT_S = 300.0


# --------------------------------------------------------------------------- host, CPU, memory


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "os": platform.system(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "python": platform.python_version(),
    }


def cpu_info() -> dict[str, Any]:
    text = _read("/proc/cpuinfo")
    model = ""
    sockets: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key == "physical id":
            sockets.add(value.strip())
    info: dict[str, Any] = {
        "count": os.cpu_count() or 0,
        "model": model or platform.processor() or platform.machine(),
        "sockets": len(sockets) or None,
    }
    if hasattr(os, "sched_getaffinity"):
        info["usable"] = len(os.sched_getaffinity(0))
    # A container's CPU quota (cgroup v2): "max 100000" or "200000 100000" (= 2 CPUs).
    quota = _read("/sys/fs/cgroup/cpu.max").split()
    if len(quota) == 2 and quota[0] != "max":
        info["cgroup_limit"] = round(int(quota[0]) / int(quota[1]), 2)
    return info


def memory_info() -> dict[str, Any]:
    fields: dict[str, int] = {}
    for line in _read("/proc/meminfo").splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            fields[key] = int(parts[0]) * 1024  # reported in kB
    total = fields.get("MemTotal")
    if total is None and hasattr(os, "sysconf"):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            total = None
    available = fields.get("MemAvailable")
    return {
        "total_gb": round(total / 1e9, 2) if total else None,
        "available_gb": round(available / 1e9, 2) if available else None,
    }


# --------------------------------------------------------------------------- disk


def _mount_of(path: str) -> dict[str, str]:
    """The mount (device, filesystem type) a path lives on, from /proc/mounts."""
    real = os.path.realpath(path)
    best: tuple[str, str, str] = ("", "", "")
    for line in _read("/proc/mounts").splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        source, point, fstype = parts[0], parts[1].replace("\\040", " "), parts[2]
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[1]):
            best = (source, point, fstype)
    return {"device": best[0], "mount": best[1], "fstype": best[2]}


def disk_benchmark(directory: str | None = None, size_mb: int = 16, block_mb: int = 4) -> dict[str, Any]:
    """Sequential write (fsync'd) then read of a temporary file, in MB/s."""
    directory = directory or tempfile.gettempdir()
    block = os.urandom(block_mb * 1_000_000)  # random: compression or dedup must not flatter the disk
    blocks = max(1, size_mb // block_mb)
    nbytes = blocks * len(block)
    result: dict[str, Any] = {"path": directory, **_mount_of(directory), "size_mb": nbytes // 1_000_000}
    fd, path = tempfile.mkstemp(prefix="lockstep-probe-", dir=directory)
    try:
        start = time.perf_counter()
        for _ in range(blocks):
            view = memoryview(block)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)  # the data is on the device, not in the page cache
        write_s = time.perf_counter() - start
        os.close(fd)
        fd = -1
        rfd = os.open(path, os.O_RDONLY)
        try:
            # Drop the file from the page cache so the read hits the device (a no-op on tmpfs).
            evicted = False
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(rfd, 0, 0, os.POSIX_FADV_DONTNEED)
                evicted = True
            start = time.perf_counter()
            got = 0
            while True:
                chunk = os.read(rfd, len(block))
                if not chunk:
                    break
                got += len(chunk)
            read_s = time.perf_counter() - start
        finally:
            os.close(rfd)
        result.update(
            write_mbps=round(nbytes / 1e6 / max(write_s, 1e-9), 1),
            read_mbps=round(got / 1e6 / max(read_s, 1e-9), 1),
            read_cache_evicted=evicted,
        )
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(path)
    return result


# --------------------------------------------------------------------------- nvidia-smi and the driver


def _smi(fields: str) -> list[list[str]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    out = subprocess.run(
        [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"nvidia-smi --query-gpu={fields} exited with {out.returncode}")
    return [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def _int_or_none(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None  # "[N/A]", "[Not Supported]": ECC off or absent


def nvidia_smi_info() -> dict[str, Any]:
    """GPUs as nvidia-smi sees them, with their volatile double-bit ECC counts."""
    try:
        rows = _smi("index,uuid,name,pci.bus_id,driver_version,memory.total")
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return {"available": True, "error": str(exc)}
    if rows is None:
        return {"available": False}
    gpus: list[dict[str, Any]] = [  # JSON objects, one per GPU
        {"index": int(r[0]), "uuid": r[1], "name": r[2], "pci_bus_id": r[3], "driver_version": r[4],
         "memory_mib": _int_or_none(r[5])}
        for r in rows if len(r) >= 6
    ]
    # Uncorrected = double-bit errors: a GPU with any silently corrupts work.
    try:
        ecc = {int(r[0]): _int_or_none(r[1]) for r in _smi("index,ecc.errors.uncorrected.volatile.total") or []}
    except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        ecc = {}
        for g in gpus:
            g["ecc_error"] = str(exc)
    for g in gpus:
        g["ecc_double_bit"] = ecc.get(g["index"])
    return {"available": True, "gpus": gpus}


def cuda_driver_version() -> str | None:
    """The CUDA version the installed driver supports, straight from libcuda (no torch needed)."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value:
            return f"{version.value // 1000}.{version.value % 1000 // 10}"
    return None


# --------------------------------------------------------------------------- GPU measurements (torch)


def _cuda_ms(torch: Any, fn: Any, iters: int, warmup: int) -> float:
    """Mean milliseconds per call of fn, timed with CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / iters


def _matmul_tflops(torch: Any, dtype: Any, n: int, iters: int) -> float:
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    out = torch.empty(n, n, device="cuda", dtype=dtype)
    ms = _cuda_ms(torch, lambda: torch.matmul(a, b, out=out), iters, warmup=max(3, iters // 5))
    return round(2 * n**3 / (ms / 1e3) / 1e12, 1)


def _copy_gbps(torch: Any, nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _cuda_ms(torch, lambda: dst.copy_(src), iters=20, warmup=3)
    return round(2 * nbytes / (ms / 1e3) / 1e9, 1)  # each byte is read once and written once


def _host_gbps(torch: Any, nbytes: int) -> dict[str, float]:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    h2d = _cuda_ms(torch, lambda: dev.copy_(host, non_blocking=True), iters=10, warmup=2)
    d2h = _cuda_ms(torch, lambda: host.copy_(dev, non_blocking=True), iters=10, warmup=2)
    return {"h2d_gbps": round(nbytes / (h2d / 1e3) / 1e9, 2), "d2h_gbps": round(nbytes / (d2h / 1e3) / 1e9, 2)}


def _attempt(entry: dict[str, Any], key: str, fn: Any) -> None:
    """Run one measurement; a failure is recorded on the entry, never fatal to the probe."""
    try:
        value = fn()
    except Exception as exc:  # one broken measurement must not lose the others
        entry.setdefault("errors", {})[key] = f"{type(exc).__name__}: {exc}"
        return
    if isinstance(value, dict):
        entry.update(value)
    else:
        entry[key] = value


def measure_gpu(torch: Any, index: int, quick: bool, smi: dict[str, Any] | None) -> dict[str, Any]:
    sizes = _SIZES[quick]
    torch.cuda.set_device(index)
    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or "")
    entry: dict[str, Any] = {
        "index": index,
        "name": props.name,
        "memory_gb": round(props.total_memory / 1e9, 1),
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "uuid": uuid,
        "cuda_runtime": torch.version.cuda,
        "torch": torch.__version__,
    }
    if smi:
        entry.update(
            pci_bus_id=smi.get("pci_bus_id"),
            driver_version=smi.get("driver_version"),
            ecc_double_bit=smi.get("ecc_double_bit"),
        )
    n, iters = sizes["matmul_n"], sizes["matmul_iters"]
    if torch.cuda.is_bf16_supported():
        _attempt(entry, "tflops_bf16", lambda: _matmul_tflops(torch, torch.bfloat16, n, iters))
    else:
        entry["tflops_bf16"] = None
        entry.setdefault("notes", []).append("bf16 not supported by this GPU")
    _attempt(entry, "tflops_fp16", lambda: _matmul_tflops(torch, torch.float16, n, iters))
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info(index)
    copy_bytes = min(sizes["copy_mb"] << 20, free // 4)
    _attempt(entry, "mem_bw_gbps", lambda: _copy_gbps(torch, copy_bytes))
    torch.cuda.empty_cache()
    _attempt(entry, "host", lambda: _host_gbps(torch, sizes["h2d_mb"] << 20))
    torch.cuda.empty_cache()
    return entry


def _nccl_worker(rank: int, world: int, port: int, quick: bool, out_path: str) -> None:
    """One process per GPU: all-reduce bandwidth on a large buffer and latency on 8 bytes."""
    import datetime as _dt

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=_dt.timedelta(seconds=120),
    )
    try:
        nbytes = _SIZES[quick]["nccl_mb"] << 20
        big = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        big_ms = _cuda_ms(torch, lambda: dist.all_reduce(big), iters=10 if quick else 40, warmup=5)
        small = torch.ones(2, dtype=torch.float32, device="cuda")
        small_ms = _cuda_ms(torch, lambda: dist.all_reduce(small), iters=50 if quick else 500, warmup=20)
        # The slowest rank sets the pace, as in nccl-tests.
        times = torch.tensor([big_ms, small_ms], dtype=torch.float64, device="cuda")
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        big_ms, small_ms = (float(t) for t in times.tolist())
        if rank == 0:
            algbw = nbytes / (big_ms / 1e3) / 1e9
            doc = {
                "ranks": world,
                "size_bytes": nbytes,
                "time_us": round(big_ms * 1e3, 2),
                "algbw_gbps": round(algbw, 2),
                "busbw_gbps": round(algbw * 2 * (world - 1) / world, 2),
                "latency_us": round(small_ms * 1e3, 2),
                "latency_size_bytes": 8,
                "nccl_version": _version_text(torch.cuda.nccl.version()),
                "devices": [torch.cuda.get_device_name(i) for i in range(world)],
            }
            with open(out_path, "w", encoding="utf-8") as fh:
                json.dump(doc, fh)
    finally:
        dist.destroy_process_group()


def _version_text(version: Any) -> str:
    # torch returns (2, 19, 3) in recent versions, an int such as 2708 in old ones.
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nccl_allreduce(world: int, quick: bool, timeout_s: float = _NCCL_TIMEOUT_S) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="lockstep-nccl-") as tmp:
        out_path = os.path.join(tmp, "nccl.json")
        ctx = mp.start_processes(
            _nccl_worker, args=(world, _free_port(), quick, out_path), nprocs=world, join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                for proc in ctx.processes:  # only the workers this call started
                    if proc.is_alive():
                        proc.terminate()
                raise TimeoutError(f"NCCL all-reduce did not finish in {timeout_s:.0f} s")
        with open(out_path, encoding="utf-8") as fh:
            return dict(json.load(fh))


def gpu_section(quick: bool) -> dict[str, Any]:
    smi = nvidia_smi_info()
    section: dict[str, Any] = {"gpus": [], "nvidia_smi": smi, "cuda_driver": cuda_driver_version()}
    smi_count = len(smi.get("gpus", []))
    seen = f" (nvidia-smi sees {smi_count} GPU(s))" if smi_count else ""
    try:
        import torch
    except ImportError:
        section["gpu_note"] = f"PyTorch is not installed: no GPU throughput measured{seen}"
        return section
    except Exception as exc:  # a broken CUDA install can fail at import
        section["gpu_note"] = f"PyTorch failed to import ({type(exc).__name__}: {exc}){seen}"
        return section
    section["torch"] = torch.__version__
    if not torch.cuda.is_available():
        section["gpu_note"] = f"PyTorch {torch.__version__} sees no CUDA device{seen}"
        return section
    by_uuid = {g["uuid"].removeprefix("GPU-"): g for g in smi.get("gpus", [])}
    count = torch.cuda.device_count()
    for index in range(count):
        uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
        smi_row = by_uuid.get(uuid.removeprefix("GPU-"))
        if smi_row is None and count == smi_count and "CUDA_VISIBLE_DEVICES" not in os.environ:
            smi_row = smi["gpus"][index]
        try:
            section["gpus"].append(measure_gpu(torch, index, quick, smi_row))
        except Exception as exc:  # report the GPU as broken, keep probing the rest
            section["gpus"].append({"index": index, "errors": {"gpu": f"{type(exc).__name__}: {exc}"}})
    if count >= 2:
        import torch.distributed as dist

        if dist.is_available() and dist.is_nccl_available():
            nccl: dict[str, Any] = {}
            _attempt(nccl, "nccl", lambda: nccl_allreduce(count, quick))
            section["nccl"] = nccl
        else:
            section["nccl"] = {"errors": {"nccl": "torch.distributed with NCCL is not available"}}
    return section


# --------------------------------------------------------------------------- the document


def run_probe(quick: bool = False, *, disk_dir: str | None = None) -> dict[str, Any]:
    """Measure this node; quick mode uses small sizes (seconds, for CI and smoke checks)."""
    doc: dict[str, Any] = {
        "probe_version": PROBE_VERSION,
        "measured_at": datetime.now(timezone.utc).isoformat(),  # noqa: UP017 - runs on Python < 3.11 too
        "quick": quick,
        "host": host_info(),
        "cpu": cpu_info(),
        "memory": memory_info(),
    }
    _attempt(doc, "disk", lambda: {"disk": disk_benchmark(disk_dir, _SIZES[quick]["disk_mb"])})
    try:
        doc.update(gpu_section(quick))
    except Exception as exc:  # the host figures are still worth printing
        doc.update(gpus=[], gpu_note=f"GPU probe failed: {type(exc).__name__}: {exc}")
    return doc


def benchmark_from_probe(doc: dict[str, Any], provider: str, target: str, *, gpus_required: bool = False) -> Any:
    """A broker.models.Benchmark from a probe document (imports the package: not for the bare script).

    Per-GPU figures are the node's weakest GPU: a synchronous job runs at the pace of its slowest rank.
    With ``gpus_required`` (a document someone records as a GPU node's benchmark), a probe that saw no
    GPU at all is a failed benchmark, not a healthy one: the node cannot run a GPU job. The burn-in
    path leaves it off because the local test cluster's GPUs are Slurm gres without devices.
    """
    from broker.gpus import normalise_gpu
    from broker.models import Benchmark

    measured = doc.get("gpus") or []
    # nvidia-smi sees the GPUs even without torch: it names them and counts their ECC errors.
    smi_gpus = (doc.get("nvidia_smi") or {}).get("gpus") or []
    named = [g for g in measured or smi_gpus if g.get("name")]
    names = {g["name"] for g in named}
    gpu = ""
    if len(names) == 1:
        name = next(iter(names))
        memory = named[0].get("memory_gb") or (named[0].get("memory_mib") or 0) / 1024 or None
        gpu = normalise_gpu(name, memory) or name

    def weakest(key: str) -> float | None:
        values = [g[key] for g in measured if isinstance(g.get(key), (int, float))]
        return min(values) if values else None

    nccl = doc.get("nccl") or {}
    disk = doc.get("disk") or {}
    count = len(measured or smi_gpus)
    failed = ""
    if gpus_required and count == 0:
        note = str(doc.get("gpu_note") or "").strip()
        failed = "the probe found no GPU" + (f" ({note})" if note else "")
    return Benchmark(
        provider=provider,
        target=target or doc.get("host", {}).get("hostname", ""),
        gpu=gpu,
        gpu_count=count,
        tflops_bf16=weakest("tflops_bf16"),
        mem_bw_gbps=weakest("mem_bw_gbps"),
        h2d_gbps=weakest("h2d_gbps"),
        busbw_gbps=nccl.get("busbw_gbps"),
        allreduce_latency_us=nccl.get("latency_us"),
        disk_write_mbps=disk.get("write_mbps"),
        disk_read_mbps=disk.get("read_mbps"),
        ecc_double_bit=sum(g.get("ecc_double_bit") or 0 for g in smi_gpus or measured),
        raw={"source": "probe", **doc},
        healthy=not failed,
        reason=failed,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="probe", description="Measure this node and print one JSON document.")
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds instead of minutes")
    parser.add_argument("--disk-dir", default=None, help="directory for the disk test (default: the temp dir)")
    args = parser.parse_args(argv)
    doc = run_probe(quick=args.quick, disk_dir=args.disk_dir)
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
