"""Parse the text output of nccl-tests (`all_reduce_perf` and the other `*_perf` tools).

All the tools print one table: per message size, the out-of-place and the
in-place measurement (time, algorithm bandwidth, bus bandwidth, wrong
elements), then `# Avg bus bandwidth : X`. The layout drifted across
versions, so the parser reads the table header when there is one and infers
the rest from each row:

- old versions have no `root` column (and some tools no `redop` either); new
  ones print both for every tool (`none` / `-1` where unused);
- the error column is `#wrong` (an integer count, `%g`), older `error` (a
  float such as `1e-07`), or `N/A` when validation is off (`-c 0`);
- `-I` (per-iteration timing) adds four columns to each half, `-T` a
  trailing timestamp, and trace replay leaves the out-of-place half blank;
- real logs interleave NCCL INFO lines, MPI warnings and rank prefixes
  (`[1,0]<stdout>:` from Open MPI, `0: ` from `srun -l`).

Bandwidths are GB/s with GB = 1e9 bytes, as nccl-tests computes them.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, Field

from broker.errors import SpecError
from broker.gpus import normalise_gpu
from broker.models import Benchmark

__all__ = [
    "SMALL_MESSAGE_BYTES",
    "NcclDevice",
    "NcclResult",
    "NcclRow",
    "parse_nccl",
    "small_message_latency_us",
    "to_benchmark",
]

_FIELD = "nccl-tests output"
# Up to this size an all-reduce is dominated by its latency term (nccl-tests starts at 8 B by default).
SMALL_MESSAGE_BYTES = 64 * 1024


class NcclRow(BaseModel):
    """One measurement: one message size, out-of-place or in-place."""

    size_bytes: int
    count: int
    type: str
    redop: str | None = None
    root: int | None = None
    in_place: bool
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    # Wrong elements (`#wrong`), or in old versions the max error (`error`, a float such as 1e-07,
    # normal rounding); None when printed N/A (validation off).
    wrong: float | None = None
    line: int = Field(default=0, exclude=True)  # 1-based line in the input, for pairing and messages


class NcclDevice(BaseModel):
    """A `#  Rank  0 Group  0 Pid 123 on host device  0 [0x07] NVIDIA H100 80GB HBM3` line."""

    rank: int
    host: str
    device: int
    pci: str = ""
    name: str = ""


class NcclResult(BaseModel):
    collective: str | None = None  # "all_reduce", "all_gather", ... when the output names it
    avg_busbw_gbps: float | None = None  # as printed by `# Avg bus bandwidth`
    out_of_bounds: int | None = None  # `# Out of bounds values : N OK|FAILED`
    nranks: int | None = None
    devices: list[NcclDevice] = Field(default_factory=list)
    nccl_version: str | None = None
    errors_are_counts: bool = True  # False for old outputs whose `error` column is a max error
    rows: list[NcclRow]

    @property
    def mean_busbw_gbps(self) -> float:
        """Mean bus bandwidth over all rows: how nccl-tests computes its average."""
        return sum(r.busbw_gbps for r in self.rows) / len(self.rows)

    @property
    def wrong_total(self) -> float:
        return sum(r.wrong or 0.0 for r in self.rows)

    @property
    def errors_found(self) -> bool:
        """True when the run itself reported corrupted results."""
        return bool(self.out_of_bounds) or (self.errors_are_counts and self.wrong_total > 0)

    def to_json_dict(self) -> dict[str, Any]:
        """The documented JSON shape: avg_busbw_gbps and rows (plus a few more keys).

        When the output was cut before the summary line, avg_busbw_gbps is the
        mean over the rows (as nccl-tests computes it) and avg_busbw_source says so.
        """
        printed = self.avg_busbw_gbps is not None
        return {
            "avg_busbw_gbps": self.avg_busbw_gbps if printed else round(self.mean_busbw_gbps, 6),
            "avg_busbw_source": "printed" if printed else "rows",
            "collective": self.collective,
            "nranks": self.nranks,
            "out_of_bounds": self.out_of_bounds,
            "small_message_latency_us": small_message_latency_us(self),
            "rows": [r.model_dump() for r in self.rows],  # every field but the input line number
        }


# --------------------------------------------------------------------------- patterns

# Prefixes launchers put in front of every line: Open MPI --tag-output, Intel MPI, srun -l.
_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\[\d+\]\s|\d+:\s)")
_ROW_START = re.compile(r"^\s*\d+\s+\d+\s+[A-Za-z_][A-Za-z0-9_]*(?:\s|$)")
_NUM = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")
_INT = re.compile(r"^[+-]?\d+$")
_NA = {"n/a", "na", "-"}
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_CLOCK = re.compile(r"^\d{2}:\d{2}:\d{2}$")
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*(\S+)", re.IGNORECASE)
_OOB = re.compile(r"Out of bounds values\s*:\s*(\d+)", re.IGNORECASE)
_STARTING = re.compile(r"Collective test starting:\s*(\S+)")
_TOOL = re.compile(r"\b([a-z][a-z0-9_]*?)_perf(?:_mpi)?\b")
_NTHREAD = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")
_RANK = re.compile(
    r"Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*)$"
)
_NCCL_VERSION = re.compile(r"NCCL version\s+(\S+)")
_TESTS_VERSION = re.compile(r"nccl-library=(\d+)")


class _Layout:
    """What the table header says: which key columns exist and how wide each half is."""

    def __init__(self, tokens: list[str]) -> None:
        names = [t.lower() for t in tokens]
        self.has_redop: bool | None = "redop" in names
        self.has_root: bool | None = "root" in names
        # "#wrong" counts wrong elements; the older "error" is a max error, where 1e-07 is fine.
        self.error_counts: bool | None = "error" not in names
        # Each half starts with "time" (or "cputime"); everything up to the next one belongs to it.
        starts = [i for i, n in enumerate(names) if n in ("time", "cputime")]
        if len(starts) >= 2:
            self.group = starts[1] - starts[0]
        else:
            self.group = 4

    @classmethod
    def unknown(cls) -> _Layout:
        layout = cls([])
        layout.has_redop = None
        layout.has_root = None
        layout.error_counts = None
        return layout


def _is_header(body: str) -> list[str] | None:
    tokens = body.lstrip("#").split()
    lowered = [t.lower() for t in tokens]
    if len(tokens) >= 4 and lowered[0] == "size" and "count" in lowered and "type" in lowered:
        return tokens
    return None


def _float(tok: str, what: str, lineno: int) -> float:
    if not _NUM.match(tok):
        raise SpecError(_FIELD, f"line {lineno}: {what} {tok!r} is not a number")
    value = float(tok)
    if not math.isfinite(value):
        raise SpecError(_FIELD, f"line {lineno}: {what} {tok!r} is not finite")
    return value


def _wrong(tok: str, lineno: int) -> float | None:
    if tok.lower() in _NA:
        return None
    return _float(tok, "error count", lineno)


def _parse_row(body: str, lineno: int, layout: _Layout) -> list[NcclRow]:
    tokens = body.split()
    # A trailing `-T` timestamp: "2025-01-31 12:00:00".
    while tokens and (_CLOCK.match(tokens[-1]) or _DATE.match(tokens[-1])):
        tokens.pop()
    size, count, dtype = int(tokens[0]), int(tokens[1]), tokens[2]
    rest = tokens[3:]
    redop: str | None = None
    root: int | None = None
    if layout.has_redop is not False and rest and not _NUM.match(rest[0]) and rest[0].lower() not in _NA:
        redop = rest.pop(0)
    g = layout.group
    if layout.has_root is True or (layout.has_root is None and len(rest) % g == 1):
        if not rest or not _INT.match(rest[0]):
            raise SpecError(_FIELD, f"line {lineno}: expected a root rank after the type, got {rest[:1]}")
        root = int(rest.pop(0))
    if len(rest) not in (g, 2 * g):
        raise SpecError(
            _FIELD,
            f"line {lineno}: expected {2 * g} measurement columns (time, algbw, busbw, errors for "
            f"out-of-place and in-place) after size/count/type, found {len(rest)}",
        )
    halves = [rest[:g], rest[g:]] if len(rest) == 2 * g else [rest]
    # With one half only (trace replay leaves out-of-place blank) it is the in-place one.
    flags = [False, True] if len(halves) == 2 else [True]
    rows = []
    for in_place, half in zip(flags, halves, strict=True):
        rows.append(
            NcclRow(
                size_bytes=size,
                count=count,
                type=dtype,
                redop=redop,
                root=root,
                in_place=in_place,
                time_us=_float(half[0], "time", lineno),
                algbw_gbps=_float(half[1], "algbw", lineno),
                busbw_gbps=_float(half[2], "busbw", lineno),
                wrong=_wrong(half[3], lineno),
                line=lineno,
            )
        )
    return rows


def parse_nccl(text: str) -> NcclResult:
    """Parse one nccl-tests run; SpecError when the text holds no result table."""
    if not isinstance(text, str) or not text.strip():
        raise SpecError(_FIELD, "the input is empty")
    layout = _Layout.unknown()
    rows: list[NcclRow] = []
    devices: list[NcclDevice] = []
    collective: str | None = None
    tool_hint: str | None = None
    avg: float | None = None
    oob: int | None = None
    nranks: int | None = None
    version: str | None = None
    header_seen = False
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = _PREFIX.sub("", raw, count=1).rstrip()
        body = line.strip()
        if not body:
            continue
        if body.startswith("#"):
            header = _is_header(body)
            if header is not None:
                if rows and header_seen:
                    raise SpecError(
                        _FIELD,
                        f"line {lineno}: a second result table starts here; give one nccl-tests run per file",
                    )
                layout = _Layout(header)
                header_seen = True
                continue
            if m := _AVG.search(body):
                avg = _float(m.group(1), "Avg bus bandwidth", lineno)
            elif m := _OOB.search(body):
                oob = int(m.group(1))
            elif m := _STARTING.search(body):
                collective = _TOOL.sub(r"\1", m.group(1).rsplit("/", 1)[-1])
            elif m := _NTHREAD.search(body):
                nranks = int(m.group(1)) * int(m.group(2))  # per process; Rank lines override
            elif m := _RANK.search(body):
                devices.append(
                    NcclDevice(
                        rank=int(m.group(1)),
                        host=m.group(2),
                        device=int(m.group(3)),
                        pci=m.group(4),
                        name=m.group(5).strip(),
                    )
                )
            elif m := _TESTS_VERSION.search(body):
                version = version or m.group(1)
            if tool_hint is None and (m := _TOOL.search(body)):
                tool_hint = m.group(1)
            continue
        if _ROW_START.match(body):
            rows.extend(_parse_row(body, lineno, layout))
            continue
        # Anything else is noise (NCCL INFO, MPI warnings); a few carry facts worth keeping.
        if m := _NCCL_VERSION.search(body):
            version = m.group(1)
        if tool_hint is None and (m := _TOOL.search(body)):
            tool_hint = m.group(1)
    if not rows:
        raise SpecError(
            _FIELD,
            "no result rows found (expected lines like '  1048576  262144  float  sum  -1  35.1  29.9  "
            "52.3  0 ...' under a '#  size  count  type ...' header)",
        )
    if devices:
        nranks = len(devices)
    counts = layout.error_counts
    if counts is None:  # no header: integers are counts, floats like 1e-07 are max errors
        counts = all(r.wrong is None or float(r.wrong).is_integer() for r in rows)
    return NcclResult(
        collective=collective or tool_hint,
        avg_busbw_gbps=avg,
        out_of_bounds=oob,
        nranks=nranks,
        devices=devices,
        nccl_version=version,
        errors_are_counts=counts,
        rows=rows,
    )


def small_message_latency_us(
    result: NcclResult, *, max_size_bytes: int | None = SMALL_MESSAGE_BYTES
) -> float | None:
    """Time of the smallest non-empty message: the latency term of the collective.

    Zero-byte rows are skipped (NCCL returns without communicating). Of the
    out-of-place and in-place times at that size the lower one is taken, so a
    single noisy sample does not fail a node. When even the smallest size is
    above ``max_size_bytes`` (a run with `-b 1G`) its time measures bandwidth,
    not latency, and the answer is None; pass ``max_size_bytes=None`` for the
    time of the smallest size whatever it is.
    """
    sized = [r for r in result.rows if r.size_bytes > 0]
    if not sized:
        return None
    smallest = min(r.size_bytes for r in sized)
    if max_size_bytes is not None and smallest > max_size_bytes:
        return None
    return min(r.time_us for r in sized if r.size_bytes == smallest)


def to_benchmark(result: NcclResult, provider: str, target: str) -> Benchmark:
    """A Benchmark record of one nccl-tests run on `target` (a host or SKU) of `provider`."""
    names = {d.name for d in result.devices if d.name}
    gpu = ""
    if len(names) == 1:
        gpu = normalise_gpu(next(iter(names))) or next(iter(names))
    latency = small_message_latency_us(result) if result.collective in (None, "all_reduce") else None
    busbw = result.avg_busbw_gbps if result.avg_busbw_gbps is not None else result.mean_busbw_gbps
    healthy, reason = True, ""
    if result.errors_found:
        healthy = False
        reason = (
            f"nccl-tests reported corrupted results: {result.wrong_total:g} wrong elements, "
            f"{result.out_of_bounds or 0} out-of-bounds values"
        )
    return Benchmark(
        provider=provider,
        target=target,
        gpu=gpu,
        gpu_count=result.nranks or 0,
        busbw_gbps=busbw,
        allreduce_latency_us=latency,
        healthy=healthy,
        reason=reason,
        raw={"source": "nccl-tests", "nccl_version": result.nccl_version, **result.to_json_dict()},
    )
