"""Benchmark: the spot and burst policies over real traces, beside the published ones (issue 16).

Deadline jobs (the setting of "Can't Be Late", NSDI'24): every spot trace under
``<data>/spot`` (each a JSON ``{"metadata": {"gap_seconds"}, "data"}``), a 48-hour job with
a 52-hour (tight) and a 70-hour (loose) deadline, a 0.2-hour changeover, submitted every
48 hours (every 36 hours on the week-long traces, every 12 on the two-day ones) from hour 24
of the trace, so that ``lockstep`` has a day of market history to learn from. Traces
shorter than 96 hours scale the job and deadlines down with them. On the 30–34-second
traces the changeover is rounded to whole ticks (0.196–0.2 hours) so the exact optimum
runs on the tick lattice. Prices: AWS p3.2xlarge (one V100) in us-west-2 from the bundled
catalog, spot $0.918 and on-demand $3.06 an hour (only their ratio matters to the shares).

Per trace family and policy it prints the cost relative to ``ondemand``, the share of the
gap between ``greedy`` and ``optimal`` the policy closes — Σ(greedy − policy) / Σ(greedy −
optimal) over the family's jobs — and the deadline misses; then the mean of the per-family
shares, of the per-file shares (over the files where greedy is not optimal, and without those
where it is within 1% of the optimum: their share is noise), and the share over all jobs pooled.

Cluster: the Alibaba GPU trace (``<data>/traces/alibaba-gpu-v2023/openb_pod_list_default.csv``)
against on-prem pools of 16, 32 and 64 GPUs, each policy's cost relative to ``cloud-only``,
waits, misses and the share of jobs that burst.

It writes a PNG chart of both (``--png``) and times one deadline job over a 45-day trace.

    python bench/policies.py                   # everything, ../shared/data, <tmp>/lockstep-policies.png
    python bench/policies.py --data DIR --png out.png --workers 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker.simulate.cluster import CLUSTER_POLICIES, ClusterConfig, run_cluster  # noqa: E402
from broker.simulate.deadline import DeadlineJob, make_policy, optimal, simulate  # noqa: E402
from broker.simulate.traces import SpotTrace, load_pods, load_spot_trace, spot_trace_files  # noqa: E402
from policies.spot import _PLANS  # noqa: E402
from providers.catalog.client import aws_on_demand_price, aws_spot_price  # noqa: E402

POLICIES = ("ondemand", "greedy", "uniform-progress", "lockstep")
JOB_HOURS, DEADLINES, CHANGEOVER_HOURS = 48.0, (52.0, 70.0), 0.2
POOLS = (16, 32, 64)
CLUSTER_SPOT = "spot/availability/1-node/aws-10-26-2022/us-west-2a_v100_8.json"


def prices() -> tuple[float, float]:
    spot = aws_spot_price("p3.2xlarge", "usw2-az1")
    od = aws_on_demand_price("p3.2xlarge", "us-west-2")
    assert spot is not None and od is not None
    return spot, od


def cases(trace: SpotTrace) -> list[tuple[float, float, float, float]]:
    """(job hours, deadline hours, changeover hours, start hour) for one trace."""
    scale = min(1.0, trace.hours / 96.0)
    gap = trace.gap_seconds
    changeover = CHANGEOVER_HOURS
    if gap < 120:
        changeover = round(CHANGEOVER_HOURS * 3600 / gap) * gap / 3600.0
    every = 48.0 if trace.hours > 400 else 36.0 if trace.hours > 96 else 12.0
    first = 24.0 if trace.hours > 96 else 0.0
    out = []
    for deadline in DEADLINES:
        d = deadline * scale
        for start in np.arange(first, trace.hours - d + 1e-9, every):
            out.append((JOB_HOURS * scale, d, changeover, float(start)))
    return out


def run_file(path: str) -> list[dict]:
    """Every case of one trace file, every policy and the optimum."""
    trace = load_spot_trace(path)
    spot, od = prices()
    rows = []
    for job_h, deadline_h, changeover_h, start in cases(trace):
        job = DeadlineJob(job_h, deadline_h, changeover_h, spot, od)
        first = int(start * 3600 // trace.gap_seconds)
        window, history = trace.available[first:], trace.available[:first]
        row = {"file": Path(path).stem, "family": Path(path).parent.name, "deadline": deadline_h, "start": start}
        for name in POLICIES:
            r = simulate(job, window, trace.gap_seconds, make_policy(name, history, trace.gap_seconds))
            row[name] = r.cost
            row[name + "_miss"] = not r.met_deadline
        row["optimal"] = optimal(job, window, trace.gap_seconds, split=False).cost
        rows.append(row)
    return rows


def gap_closed(rows: list[dict], name: str) -> float:
    gap = sum(r["greedy"] - r["optimal"] for r in rows)
    return sum(r["greedy"] - r[name] for r in rows) / gap if gap > 1e-9 else float("nan")


def deadline_report(rows: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    names = [*POLICIES, "optimal"]
    by_family: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_family[r["family"]].append(r)
    table: dict[str, dict[str, dict[str, float]]] = {}
    print(f"\nDeadline jobs: {len(rows)} jobs over {len({(r['family'], r['file']) for r in rows})} trace files "
          f"(cost relative to ondemand; gap closed = (greedy - policy) / (greedy - optimal); misses)")
    header = f"{'family':<16}{'jobs':>5}  " + "  ".join(f"{n:>22}" for n in names)
    print(header)
    for family, rs in sorted(by_family.items()):
        cells = {}
        for n in names:
            rel = sum(r[n] for r in rs) / sum(r["ondemand"] for r in rs)
            closed = gap_closed(rs, n)
            misses = sum(1 for r in rs if r.get(n + "_miss"))
            cells[n] = {"relative_cost": rel, "gap_closed": closed, "misses": misses}
        table[family] = cells
        print(f"{family:<16}{len(rs):>5}  " + "  ".join(
            f"{c['relative_cost']:>6.3f} {c['gap_closed']:>7.1%} {c['misses']:>3d}m" .rjust(22)
            for c in cells.values()))
    fam_mean = {n: statistics.fmean(table[f][n]["gap_closed"] for f in table) for n in names}
    by_file: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_file[r["file"] + "@" + r["family"]].append(r)
    meaningful = [rs for rs in by_file.values()
                  if sum(r["greedy"] - r["optimal"] for r in rs) > 0.01 * sum(r["optimal"] for r in rs)]
    file_mean = {n: statistics.fmean(gap_closed(rs, n) for rs in meaningful) for n in names}
    gapped = [rs for rs in by_file.values() if sum(r["greedy"] - r["optimal"] for r in rs) > 1e-6]
    all_files = {n: statistics.fmean(gap_closed(rs, n) for rs in gapped) for n in names}
    pooled = {n: gap_closed(rows, n) for n in names}
    print("mean gap closed over families: " + ", ".join(f"{n} {v:.1%}" for n, v in fam_mean.items()))
    print(f"mean gap closed over the {len(meaningful)} files where greedy is not within 1% of optimal: "
          + ", ".join(f"{n} {v:.1%}" for n, v in file_mean.items()))
    print(f"mean gap closed over the {len(gapped)} files where greedy is not optimal: "
          + ", ".join(f"{n} {v:.1%}" for n, v in all_files.items()))
    print("gap closed over all jobs pooled: " + ", ".join(f"{n} {v:.1%}" for n, v in pooled.items()))
    misses = {n: sum(1 for r in rows if r.get(n + "_miss")) for n in names}
    print("deadline misses: " + ", ".join(f"{n} {v}" for n, v in misses.items()))
    worse = [f for f in table if table[f]["lockstep"]["gap_closed"] < table[f]["uniform-progress"]["gap_closed"]]
    print("families where lockstep closes less than uniform-progress: " + (", ".join(worse) or "none"))
    table["_mean_over_families"] = {n: {"gap_closed": v} for n, v in fam_mean.items()}
    table["_mean_over_files"] = {n: {"gap_closed": v} for n, v in file_mean.items()}
    table["_mean_over_gapped_files"] = {n: {"gap_closed": v} for n, v in all_files.items()}
    table["_pooled"] = {n: {"gap_closed": v} for n, v in pooled.items()}
    return table


def run_cluster_case(args: tuple[str, str, int, str]) -> dict:
    pods_path, spot_path, pool, policy = args
    t0 = time.perf_counter()
    r = run_cluster(load_pods(pods_path), ClusterConfig(onprem_gpus=pool), load_spot_trace(spot_path), policy)
    d = r.as_dict()
    d["seconds"] = time.perf_counter() - t0
    return d


def cluster_report(results: list[dict]) -> None:
    print("\nCluster: Alibaba GPU trace (H100 prices from the bundled catalog; cost relative to cloud-only)")
    cloud = next(r["cost"] for r in results if r["policy"] == "cloud-only")
    print(f"{'pool':>5} {'policy':<15}{'cost $':>11}{'rel':>7}{'owned $':>11}{'spot $':>9}{'on-demand $':>12}"
          f"{'mean wait h':>12}{'p95 wait h':>11}{'misses':>8}{'burst':>7}{'util':>6}{'hours':>7}")
    for r in results:
        c = r["cost_by_market"]
        print(f"{r['onprem_gpus']:>5} {r['policy']:<15}{r['cost']:>11,.0f}{r['cost'] / cloud:>7.2f}{c['owned']:>11,.0f}"
              f"{c['spot']:>9,.0f}{c['on_demand']:>12,.0f}{r['mean_wait_hours']:>12.2f}{r['p95_wait_hours']:>11.2f}"
              f"{r['deadline_misses']:>8,}{r['burst_share']:>7.1%}{r['onprem_utilisation']:>6.0%}{r['hours']:>7,.0f}")


def chart(table: dict, cluster: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = sorted(f for f in table if not f.startswith("_"))
    names = ["greedy", "uniform-progress", "lockstep"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        vals = [max(-0.5, table[f][n]["gap_closed"]) for f in families]
        ax1.bar(np.arange(len(families)) + i * width, vals, width, label=n)
    ax1.axhline(0.6, color="grey", linestyle="--", linewidth=0.8)
    ax1.set_xticks(np.arange(len(families)) + 0.4 - width / 2, families, rotation=15)
    ax1.set_ylabel("share of the greedy → optimal gap closed")
    ax1.set_ylim(-0.5, 1.05)
    ax1.set_title("Deadline jobs on spot (below −50% clipped)")
    ax1.legend(fontsize=8)
    pools = sorted({r["onprem_gpus"] for r in cluster if r["policy"] != "cloud-only"})
    cloud = next(r for r in cluster if r["policy"] == "cloud-only")
    for pol, marker in (("onprem-only", "s"), ("cheapest-first", "^"), ("lockstep", "o")):
        rs = [next(r for r in cluster if r["policy"] == pol and r["onprem_gpus"] == p) for p in pools]
        ax2.plot([r["mean_wait_hours"] + 1e-3 for r in rs], [r["cost"] / 1000 for r in rs], marker=marker,
                 label=pol)
        for r in rs:
            ax2.annotate(f"{r['onprem_gpus']}", (r["mean_wait_hours"] + 1e-3, r["cost"] / 1000), fontsize=7)
    ax2.plot([1e-3], [cloud["cost"] / 1000], "k*", markersize=10, label="cloud-only")
    ax2.set_xscale("log")
    ax2.set_xlabel("mean wait, hours (log)")
    ax2.set_ylabel("total cost, $ thousands")
    ax2.set_title("Cluster bursting: cost vs wait per pool size (GPUs)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"\nchart: {path}")


def time_45_days(data: Path) -> None:
    """One deadline job over a 45-day trace (two copies of a 27-day one, cut at 45 days), per policy."""
    base = load_spot_trace(data / "spot/availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json")
    ticks = int(45 * 24 * 3600 / base.gap_seconds)
    trace = SpotTrace("45d", base.gap_seconds, np.tile(base.available, 2)[:ticks])
    spot, od = prices()
    print(f"\nOne job over a 45-day trace ({ticks:,} ticks of {base.gap_seconds} s), no plan cached; "
          "min / median of 3 runs:")
    for label, job, start in (("48 h job, 52 h deadline, submitted at day 40", DeadlineJob(48, 52, 0.2, spot, od),
                               40 * 24.0),
                              ("40-day job, 45-day deadline", DeadlineJob(40 * 24, 45 * 24, 0.2, spot, od), 0.0)):
        first = int(start * 3600 // trace.gap_seconds)
        for name in (*POLICIES, "optimal"):
            times = []
            for _ in range(3):
                _PLANS.clear()  # cold: the plan is solved inside the timing
                t0 = time.perf_counter()
                if name == "optimal":
                    optimal(job, trace.available[first:], trace.gap_seconds)
                else:
                    simulate(job, trace.available[first:], trace.gap_seconds,
                             make_policy(name, trace.available[:first], trace.gap_seconds))
                times.append(time.perf_counter() - t0)
            print(f"  {label:<46} {name:<17} {min(times):7.3f} s / {statistics.median(times):7.3f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--png", default=str(Path(tempfile.gettempdir()) / "lockstep-policies.png"))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    data = Path(args.data)
    files = spot_trace_files(data / "spot")
    if not files:
        sys.exit(f"no spot traces under {data / 'spot'}")
    t0 = time.perf_counter()
    pods = data / "traces/alibaba-gpu-v2023/openb_pod_list_default.csv"
    jobs = [(str(pods), str(data / CLUSTER_SPOT), 0, "cloud-only")]
    jobs += [(str(pods), str(data / CLUSTER_SPOT), p, pol) for p in POOLS for pol in CLUSTER_POLICIES
             if pol != "cloud-only"]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        # longest first: the fine-grained traces, then the cluster runs
        order = sorted(files, key=lambda f: -len(load_spot_trace(f).available) / max(1, load_spot_trace(f).hours))
        deadline_futures = [pool.submit(run_file, str(f)) for f in order]
        cluster_futures = [pool.submit(run_cluster_case, j) for j in jobs]
        rows = [r for fut in deadline_futures for r in fut.result()]
        cluster = [fut.result() for fut in cluster_futures]
    sim_s = time.perf_counter() - t0
    table = deadline_report(rows)
    cluster_report(cluster)
    chart(table, cluster, args.png)
    print(f"\nsimulations: {sim_s:.1f} s wall on {args.workers} worker(s)")
    time_45_days(data)
    print(f"whole report: {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
