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
    python bench/policies.py --json numbers.json  # every number, full precision: diff two runs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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
from broker.simulate.zones import LockstepZones, Migration, aligned, optimal_zones, simulate_zones  # noqa: E402
from policies.spot import _PLANS  # noqa: E402
from providers.catalog.client import aws_on_demand_price, aws_spot_price  # noqa: E402

POLICIES = ("ondemand", "greedy", "uniform-progress", "lockstep")
JOB_HOURS = 48.0
SLACKS = (0.1, 0.3, 0.5)  # deadline = job × (1 + slack): the 10% to 50%
CHANGEOVERS = (0.05, 0.2)  # hours: a changeover well under one 600 s tick, and one longer than a tick
NEAR_OPTIMAL = 0.02  # "greedy within 2% of optimal" and "lockstep within 2% of on-demand above greedy" (issue 30)
POOLS = (16, 32, 64)
CLUSTER_SPOT = "spot/availability/1-node/aws-10-26-2022/us-west-2a_v100_8.json"


def prices() -> tuple[float, float]:
    spot = aws_spot_price("p3.2xlarge", "usw2-az1")
    od = aws_on_demand_price("p3.2xlarge", "us-west-2")
    assert spot is not None and od is not None
    return spot, od


def cases(trace: SpotTrace, changeovers: tuple[float, ...] = CHANGEOVERS,
          slacks: tuple[float, ...] = SLACKS) -> list[tuple[float, float, float, float]]:
    """(job hours, deadline hours, changeover hours, start hour) for one trace."""
    scale = min(1.0, trace.hours / 96.0)
    gap = trace.gap_seconds
    every = 48.0 if trace.hours > 400 else 36.0 if trace.hours > 96 else 12.0
    first = 24.0 if trace.hours > 96 else 0.0
    out = []
    for changeover in changeovers:
        if gap < 120:  # the optimum runs on the tick lattice
            changeover = max(1, round(changeover * 3600 / gap)) * gap / 3600.0
        for slack in slacks:
            d = JOB_HOURS * (1 + slack) * scale
            for start in np.arange(first, trace.hours - d + 1e-9, every):
                out.append((JOB_HOURS * scale, d, changeover, float(start)))
    return out


def run_file(path: str, changeovers: tuple[float, ...] = CHANGEOVERS) -> list[dict]:
    """Every case of one trace file, every policy and the optimum."""
    trace = load_spot_trace(path)
    spot, od = prices()
    rows = []
    for job_h, deadline_h, changeover_h, start in cases(trace, changeovers):
        job = DeadlineJob(job_h, deadline_h, changeover_h, spot, od)
        first = int(start * 3600 // trace.gap_seconds)
        window, history = trace.available[first:], trace.available[:first]
        row = {"file": Path(path).stem, "family": Path(path).parent.name, "deadline": deadline_h, "start": start,
               "changeover": round(changeover_h, 2), "slack": round(deadline_h / job_h - 1, 2)}
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
    by_fc: dict[tuple[str, float], list[dict]] = defaultdict(list)
    for r in rows:
        by_fc[(r["family"], r["changeover"])].append(r)
    worse = [f"{f} @ {c:g} h" for (f, c), rs in sorted(by_fc.items())
             if sum(r["lockstep"] for r in rs) > sum(r["uniform-progress"] for r in rs) + 1e-9]
    print("families × changeovers where lockstep costs more than uniform-progress: " + (", ".join(worse) or "none"))
    for (f, c), rs in sorted(by_fc.items()):
        print(f"  {f:<16} changeover {c:g} h: gap closed lockstep {gap_closed(rs, 'lockstep'):.1%}, "
              f"uniform-progress {gap_closed(rs, 'uniform-progress'):.1%} ({len(rs)} jobs)")
    near = [r for r in rows if r["greedy"] - r["optimal"] <= NEAR_OPTIMAL * r["optimal"]]
    regret = [r for r in near if r["lockstep"] - r["greedy"] > NEAR_OPTIMAL * r["ondemand"]]
    worst = max((r["lockstep"] - r["greedy"]) / r["ondemand"] for r in near) if near else 0.0
    print(f"runs where greedy is within {NEAR_OPTIMAL:.0%} of optimal: {len(near)}; lockstep above greedy by more "
          f"than {NEAR_OPTIMAL:.0%} of on-demand on {len(regret)} (worst: {worst:+.2%} of on-demand)")
    for r in regret[:10]:
        print(f"    {r['family']}/{r['file']} start {r['start']:g} h, slack {r['slack']:.0%}, changeover "
              f"{r['changeover']:g} h: greedy {r['greedy'] / r['ondemand']:.3f}, lockstep "
              f"{r['lockstep'] / r['ondemand']:.3f}, optimal {r['optimal'] / r['ondemand']:.3f}")
    table["_checks"] = {"lockstep": {"worse_than_uniform_progress": len(worse), "near_optimal_runs": len(near),
                                     "near_optimal_regrets": len(regret), "worst_near_optimal_regret": worst}}
    table["_mean_over_families"] = {n: {"gap_closed": v} for n, v in fam_mean.items()}
    table["_mean_over_files"] = {n: {"gap_closed": v} for n, v in file_mean.items()}
    table["_mean_over_gapped_files"] = {n: {"gap_closed": v} for n, v in all_files.items()}
    table["_pooled"] = {n: {"gap_closed": v} for n, v in pooled.items()}
    return table


# Multi-zone (issue 30): the job's data and checkpoint, and what moving them costs (AWS inter-AZ and
# inter-region transfer is $0.01–0.02/GB; 2 Gbps sustained to and from object storage)
DATA_GB, EGRESS_USD_PER_GB, TRANSFER_GBPS = 50.0, 0.02, 2.0


def zone_groups(files: list[Path]) -> dict[str, list[Path]]:
    """The traces of one family and one instance type in several zones (aligned in time), by family/type."""
    groups: dict[str, list[Path]] = defaultdict(list)
    for f in files:
        kind = f.stem.partition("_")[2]
        groups[f"{f.parent.name}/{kind}"].append(f)
    return {k: sorted(v) for k, v in groups.items() if len(v) > 1}


def run_group(args: tuple[list[str], tuple[float, ...]]) -> list[dict]:
    """Every case of one zone group, the job's home turning through its zones: single-zone greedy,
    uniform progress and lockstep on the home zone, lockstep across the zones, and both optima."""
    paths, changeovers = args
    traces = [load_spot_trace(p) for p in paths]
    avail, gap = aligned(traces)
    spot, od = prices()
    rows = []
    seconds = round(DATA_GB * 8 / TRANSFER_GBPS)
    if gap < 120:  # the optimum runs on the tick lattice (as the changeover)
        seconds = max(1, round(seconds / gap)) * gap
    migration = Migration(seconds, DATA_GB * EGRESS_USD_PER_GB)
    span = SpotTrace("zones", gap, avail[0])
    for i, (job_h, deadline_h, changeover_h, start) in enumerate(cases(span, changeovers)):
        job = DeadlineJob(job_h, deadline_h, changeover_h, spot, od)
        first = int(start * 3600 // gap)
        for home in (i % len(traces),):  # the home zone turns with the cases: each zone is home to some jobs
            order = [home, *(z for z in range(len(traces)) if z != home)]
            window, history = avail[order, first:], avail[order, :first]
            row = {"group": paths[0].split("/")[-2] + "/" + Path(paths[0]).stem.partition("_")[2],
                   "home": Path(paths[home]).stem, "start": start, "changeover": round(changeover_h, 2),
                   "slack": round(deadline_h / job_h - 1, 2)}
            for name in ("greedy", "uniform-progress", "lockstep"):
                r = simulate(job, window[0], gap, make_policy(name, history[0], gap))
                row[name], row[name + "_miss"] = r.cost, not r.met_deadline
            row["optimal"] = optimal(job, window[0], gap, split=False).cost
            r = simulate_zones(job, window, gap, LockstepZones(history, gap), migration)
            row["lockstep-zones"], row["lockstep-zones_miss"], row["moves"] = r.cost, not r.met_deadline, r.moves
            row["optimal-zones"] = optimal_zones(job, window, gap, migration).cost
            row["ondemand"] = od * job_h
            rows.append(row)
    return rows


def zones_report(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per zone group: cost relative to on-demand and the share of the gap between single-zone greedy and the
    multi-zone optimum each policy closes, pooled over the group's jobs (every zone as home)."""
    names = ("greedy", "uniform-progress", "lockstep", "optimal", "lockstep-zones", "optimal-zones")
    print(f"\nAcross zones: {len(rows)} jobs (the home zone turning through each group's zones; {DATA_GB:g} GB at "
          f"{TRANSFER_GBPS:g} Gbps, ${EGRESS_USD_PER_GB}/GB egress); cost relative to ondemand, share of the gap "
          "single-zone greedy -> multi-zone optimal closed, misses")
    print(f"{'group':<26}{'jobs':>5}  " + "  ".join(f"{n:>20}" for n in names) + "   moves/job")

    def closed(rs: list[dict], n: str) -> float:
        gap = sum(r["greedy"] - r["optimal-zones"] for r in rs)
        return sum(r["greedy"] - r[n] for r in rs) / gap if gap > 1e-9 else float("nan")

    by_group: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_group[r["group"]].append(r)
    out: dict[str, dict[str, float]] = {}
    for group, rs in [*sorted(by_group.items()), ("pooled", rows)]:
        od = sum(r["ondemand"] for r in rs)
        cells = {n: (sum(r[n] for r in rs) / od, closed(rs, n), sum(1 for r in rs if r.get(n + "_miss")))
                 for n in names}
        out[group] = {n: c[1] for n, c in cells.items()}
        print(f"{group:<26}{len(rs):>5}  " + "  ".join(f"{c[0]:>6.3f} {c[1]:>7.1%} {c[2]:>2d}m".rjust(20)
                                                    for c in cells.values())
              + f"   {sum(r['moves'] for r in rs) / len(rs):.2f}")
    return out


def run_cluster_case(args: tuple[str, str, int, str]) -> dict:
    pods_path, spot_path, pool, policy = args
    t0 = time.perf_counter()
    r = run_cluster(load_pods(pods_path), ClusterConfig(onprem_gpus=pool), load_spot_trace(spot_path), policy)
    d = r.as_dict()
    d["exact"] = dataclasses.asdict(r)  # unrounded, for --json
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


def write_json(path: str, rows: list[dict], cluster: list[dict]) -> None:
    """Every number the tables come from, exactly (floats round-trip), in a stable order (to diff two runs)."""
    out = {"deadline": sorted(rows, key=lambda r: (r["family"], r["file"], r["deadline"], r["start"])),
           "cluster": [{k: v for k, v in r.items() if k != "seconds"} for r in cluster]}
    Path(path).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--png", default=str(Path(tempfile.gettempdir()) / "lockstep-policies.png"))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", metavar="FILE", help="also write every job's and cluster run's numbers (full precision)")
    ap.add_argument("--only", choices=("deadline", "multizone"),
                    help="run one part alone (while iterating): the single-zone deadline table or the multi-zone one")
    ap.add_argument("--family", action="append", default=[], help="only trace families whose name holds this")
    ap.add_argument("--changeover", type=float, action="append", default=[], help="only these changeovers (hours)")
    args = ap.parse_args()
    data = Path(args.data)
    files = [f for f in spot_trace_files(data / "spot")
             if not args.family or any(x in f.parent.name for x in args.family)]
    if not files:
        sys.exit(f"no spot traces under {data / 'spot'}")
    changeovers = tuple(args.changeover) or CHANGEOVERS
    t0 = time.perf_counter()
    if args.only == "multizone":
        groups = zone_groups(files)
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            zrows = [r for rs in pool.map(run_group, [([str(p) for p in g], changeovers) for g in groups.values()])
                     for r in rs]
        zones_report(zrows)
        print(f"\nsimulations: {time.perf_counter() - t0:.1f} s wall on {args.workers} worker(s)")
        return
    if args.only == "deadline":
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            rows = [r for rs in pool.map(run_file, map(str, files), [changeovers] * len(files)) for r in rs]
        if args.json:
            write_json(args.json, rows, [])
        deadline_report(rows)
        print(f"\nsimulations: {time.perf_counter() - t0:.1f} s wall on {args.workers} worker(s)")
        return
    pods = data / "traces/alibaba-gpu-v2023/openb_pod_list_default.csv"
    jobs = [(str(pods), str(data / CLUSTER_SPOT), 0, "cloud-only")]
    jobs += [(str(pods), str(data / CLUSTER_SPOT), p, pol) for p in POOLS for pol in CLUSTER_POLICIES
             if pol != "cloud-only"]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        # longest first, so that the pool's workers finish together: the cluster's lockstep runs
        # (the smaller the pool, the more decisions), the fine-grained traces, then the rest
        cluster_futures = {j: pool.submit(run_cluster_case, j) for j in sorted(
            jobs, key=lambda j: (j[3] != "lockstep", j[2]))}
        traces = {f: load_spot_trace(f) for f in files}
        order = sorted(files, key=lambda f: -len(traces[f].available) / max(1, traces[f].hours))
        deadline_futures = [pool.submit(run_file, str(f)) for f in order]
        rows = [r for fut in deadline_futures for r in fut.result()]
        cluster = [cluster_futures[j].result() for j in jobs]
    sim_s = time.perf_counter() - t0
    if args.json:
        write_json(args.json, rows, cluster)
    table = deadline_report(rows)
    cluster_report(cluster)
    chart(table, cluster, args.png)
    print(f"\nsimulations: {sim_s:.1f} s wall on {args.workers} worker(s)")
    time_45_days(data)
    print(f"whole report: {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
