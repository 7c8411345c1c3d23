"""Start-up time of the command line, beside references measured in the same run.

    python bench/startup.py [--runs 7]

Times (wall clock, a fresh interpreter each, output discarded), interleaved so that each run sees the
same machine: ``python -c pass``; ``python -c 'import gpuhunt'`` (a reference CLI-sized library, in
the ``bench`` extra; skipped when not installed); ``lockstep --help``; ``lockstep quote
examples/llama-70b-pretrain.yaml --json`` through the background broker (local mode's usual case: one is up
after the first job command; this script starts one for a scratch store and stops it at the end) and in
the command's own process (no broker up: the bundled catalog, no store opened). Prints min and median
per command and the ratio of the mins to gpuhunt's import (issue 25's targets: ``--help`` ≤ 0.7×, the quote
through the broker ≤ 1.2×). Runs the checkout's code (``-m broker`` from the repository root).
``python -X importtime -m broker quote … --json`` shows where the rest goes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    py = sys.executable
    commands = {"python -c pass": [py, "-c", "pass"]}
    if importlib.util.find_spec("gpuhunt") is not None:
        commands["python -c 'import gpuhunt'"] = [py, "-c", "import gpuhunt"]
    commands["lockstep --help"] = [py, "-m", "broker", "--help"]
    scratch = Path(tempfile.mkdtemp(prefix="lockstep-startup-"))
    db = ["--db", str(scratch / "bench.db")]
    quote = ["quote", "examples/llama-70b-pretrain.yaml", "--json"]
    commands["lockstep quote … --json (broker up)"] = [py, "-m", "broker", *db, *quote]
    commands["lockstep quote … --json (in-process)"] = [py, "-m", "broker", *quote]
    # A warm machine has the bytecode cached: without this, PYTHONDONTWRITEBYTECODE=1 in the caller's
    # environment (some sandboxes and CI images set it) makes every run compile the checkout's modules
    # again (~60 ms), which the warm-up run below is there to avoid.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)
    env["LOCKSTEP_BROKER_HOME"] = str(scratch / "brokers")
    # `jobs` starts the scratch store's background broker (the quote alone never starts one).
    subprocess.run([py, "-m", "broker", *db, "jobs", "--json"], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    try:
        run(args.runs, commands, env)
    finally:
        subprocess.run([py, "-m", "broker", *db, "server", "stop"], cwd=ROOT, env=env, check=False,
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(scratch, ignore_errors=True)


def run(runs: int, commands: dict[str, list[str]], env: dict[str, str]) -> None:
    """Time every command ``runs`` times, interleaved; print min, median and the ratio to gpuhunt's import."""
    times: dict[str, list[float]] = {k: [] for k in commands}
    load0 = os.getloadavg()
    for cmd in commands.values():  # warm the page cache and write the .pyc files first
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    for _ in range(runs):
        for name, cmd in commands.items():
            t0 = time.perf_counter()
            done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            times[name].append((time.perf_counter() - t0) * 1000)
            if done.returncode not in (0,):
                raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr.decode()[-300:]}")
    load1 = os.getloadavg()
    ref = min(times["python -c 'import gpuhunt'"]) if "python -c 'import gpuhunt'" in times else None
    print(f"{runs} interleaved runs, {os.cpu_count()} CPUs; load average {load0[0]:.1f} before, "
          f"{load1[0]:.1f} after")
    print(f"{'command':<42}{'min ms':>9}{'median ms':>11}{'min / gpuhunt':>15}")
    for name, ts in times.items():
        ratio = f"{min(ts) / ref:>14.2f}x" if ref else f"{'—':>15}"
        print(f"{name:<42}{min(ts):>9.0f}{statistics.median(ts):>11.0f}{ratio}")


if __name__ == "__main__":
    main()
