"""Builders for simulation tests: small traces and pod files written by the tests themselves."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from broker.simulate.deadline import JobSeconds, Segment


def write_trace(path: Path, data: list[int], gap: int = 600) -> Path:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return path


def write_pods(path: Path, pods: list[tuple[str, int, float, float, str]]) -> Path:
    """pods: (name, gpus, arrival s, run s, qos), in the Alibaba CSV layout."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
                    "creation_time", "deletion_time", "scheduled_time"])
        for name, gpus, arrival, run, qos in pods:
            w.writerow([name, 1000, 1024, gpus, 1000, "", qos, "Succeeded", int(arrival), int(arrival + run),
                        int(arrival)])
    return path


def replay_check(segments: list[Segment], js: JobSeconds, avail: list[bool], gap: int) -> tuple[int, int | None]:
    """Recompute progress and finish from the schedule alone (not from the engine's own counters).

    Each segment is one instance's run: it starts with a changeover, then makes progress. Spot
    segments may only cover ticks where spot was available. Returns (work done, finish second).
    """
    done, finish, last_end = 0, None, -1
    for s in segments:
        assert s.start >= last_end, "segments overlap"
        last_end = s.end
        if s.mode.name == "spot":
            for tick in range(s.start // gap, (s.end - 1) // gap + 1):
                assert tick < len(avail) and avail[tick], f"spot used at tick {tick}, when none could be had"
        done += max(0, (s.end - s.start) - js.changeover)
        if done >= js.work and finish is None:
            finish = s.end
    return done, finish
