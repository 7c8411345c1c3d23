"""`lockstep bench parse-nccl FILE` and `lockstep probe`: thin shells over the service's nccl parser and probe.

Bad input exits with code 2 and one readable line on stderr, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from broker.errors import EXIT_BAD_INPUT, SpecError
from broker.service import Lockstep

if TYPE_CHECKING:
    from broker.service.nodes import NcclResult, NcclRow


def _console() -> Console:
    # Piped output (scripts, CI logs) gets a wide table instead of rich's 80-column default.
    return Console(width=None if sys.stdout.isatty() else 200)


app = typer.Typer(
    help="Benchmark results: parse nccl-tests output, record, list.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _group() -> None:
    """Benchmark results: parse nccl-tests output, record, list."""
    # A callback keeps this a command group even with a single command, so `parse-nccl` is always named.


def _fail(line: str) -> None:
    typer.echo(f"lockstep: {line}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def read_text(path: Path) -> str:
    """A results file's text; a missing or unreadable file is exit 2 with one line."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        _fail(f"{path}: no such file")
    except IsADirectoryError:
        _fail(f"{path}: is a directory, not a file")
    except OSError as exc:
        _fail(f"{path}: cannot read ({exc.strerror or type(exc).__name__})")
    # Logs collected from clusters are not always clean UTF-8; odd bytes must not hide the table.
    return data.decode("utf-8", errors="replace")


def _size(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _num(x: float | None) -> str:
    return "N/A" if x is None else f"{x:g}"


def _nccl_table(result: NcclResult, source: str) -> None:
    console = _console()
    table = Table(title=f"{result.collective or 'nccl-tests'} — {source}")
    for col in ("size", "count", "type", "redop", "root", "time µs", "algbw GB/s", "busbw GB/s", "#wrong",
                "in-place µs", "algbw GB/s", "busbw GB/s", "#wrong"):
        table.add_column(col, justify="left" if col in ("type", "redop") else "right")
    # Rows come out-of-place then in-place per printed line; pair them back by source line.
    lines: dict[int, dict[bool, NcclRow]] = {}
    for row in result.rows:
        lines.setdefault(row.line, {})[row.in_place] = row
    for pair in lines.values():
        first = pair.get(False) or pair[True]
        cells = [_size(first.size_bytes), str(first.count), first.type, first.redop or "",
                 "" if first.root is None else str(first.root)]
        for in_place in (False, True):
            r = pair.get(in_place)
            cells += [f"{r.time_us:g}", f"{r.algbw_gbps:.2f}", f"{r.busbw_gbps:.2f}", _num(r.wrong)] if r else [""] * 4
        table.add_row(*cells)
    console.print(table)
    doc = result.to_json_dict()
    avg = f"{doc['avg_busbw_gbps']:g} GB/s" + ("" if doc["avg_busbw_source"] == "printed" else " (mean of rows)")
    latency = doc["small_message_latency_us"]
    facts = [f"avg bus bandwidth {avg}"]
    facts.append(f"small-message latency {latency:g} µs" if latency is not None else "no small messages")
    if result.nranks:
        facts.append(f"{result.nranks} ranks")
    if result.errors_found:
        facts.append(f"[red]ERRORS: {result.wrong_total:g} wrong, {result.out_of_bounds or 0} out of bounds[/]")
    console.print("; ".join(facts))


@app.command("parse-nccl")
def parse_nccl_command(
    file: Annotated[Path, typer.Argument(help="Text output of all_reduce_perf or another nccl-tests *_perf tool.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the JSON document instead of a table.")] = False,
) -> None:
    """Parse nccl-tests output: per-size bandwidth and latency, average bus bandwidth."""
    text = read_text(file)
    try:
        result = Lockstep.parse_nccl(text)
    except SpecError as exc:
        _fail(f"{file}: {exc.reason}")
    if json_out:
        typer.echo(json.dumps(result.to_json_dict(), indent=2))
    else:
        _nccl_table(result, str(file))


def _probe_table(doc: dict[str, Any]) -> None:
    console = _console()
    host, cpu, mem, disk = doc["host"], doc["cpu"], doc["memory"], doc.get("disk") or {}
    console.print(f"[bold]{host['hostname']}[/] {host['os']} {host['kernel']} — {cpu['count']} × {cpu['model']}, "
                  f"{mem.get('total_gb')} GB RAM")
    if disk:
        console.print(f"disk {disk.get('path')} ({disk.get('fstype')} on {disk.get('device')}): "
                      f"write {disk.get('write_mbps')} MB/s, read {disk.get('read_mbps')} MB/s")
    if not doc["gpus"]:
        console.print(doc.get("gpu_note", "no GPU"))
        return
    table = Table()
    for col in ("#", "GPU", "driver", "bf16 TFLOP/s", "fp16 TFLOP/s", "mem GB/s", "H2D GB/s", "D2H GB/s", "ECC DBE"):
        table.add_column(col, justify="left" if col in ("GPU", "driver") else "right")
    for g in doc["gpus"]:
        table.add_row(*(str(g.get(k, "")) if g.get(k) is not None else "" for k in (
            "index", "name", "driver_version", "tflops_bf16", "tflops_fp16", "mem_bw_gbps", "h2d_gbps",
            "d2h_gbps", "ecc_double_bit")))
    console.print(table)
    nccl = doc.get("nccl") or {}
    if "busbw_gbps" in nccl:
        console.print(f"NCCL all-reduce over {nccl['ranks']} GPUs: bus bandwidth {nccl['busbw_gbps']} GB/s, "
                      f"{nccl['latency_size_bytes']}-byte latency {nccl['latency_us']} µs")


def probe_command(
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes: seconds instead of minutes.")] = False,
    json_out: Annotated[bool, typer.Option("--json/--table", help="One JSON document (default) or a summary.")] = True,
    disk_dir: Annotated[
        str | None, typer.Option("--disk-dir", help="Directory for the disk test (default: the temp dir).")
    ] = None,
) -> None:
    """Measure this node (GPU, memory, NCCL, disk) and print one JSON document.

    Host and disk always; GPUs, NCCL and ECC when PyTorch and CUDA are present.
    """
    from broker.cli.progress import working

    with working("measuring this node: host, disk" + ("" if quick else " (minutes)") + ", GPUs and NCCL if present"):
        doc = Lockstep.probe_this_node(quick=quick, disk_dir=disk_dir)
    if json_out:
        typer.echo(json.dumps(doc, indent=2))
    else:
        _probe_table(doc)
