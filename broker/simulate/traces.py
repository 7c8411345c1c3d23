"""Reading traces: spot availability (the "Can't Be Late" JSON format) and GPU cluster pods (Alibaba CSV).

Bad files raise :class:`~broker.errors.SpecError` naming the option that gave them, so the
CLI answers with exit code 2 and one line.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from broker.errors import SpecError


@dataclass(frozen=True)
class SpotTrace:
    """Spot availability per tick: ``available[i]`` covers ``[i*gap, (i+1)*gap)`` seconds from the start."""

    name: str
    gap_seconds: int
    available: np.ndarray  # bool, one per tick

    @property
    def hours(self) -> float:
        return len(self.available) * self.gap_seconds / 3600.0

    @property
    def availability(self) -> float:
        return float(self.available.mean()) if len(self.available) else 0.0

    def window(self, start_hour: float, hours: float) -> np.ndarray:
        """The ticks from ``start_hour`` (rounded down to a tick) that cover ``hours``."""
        first = int(start_hour * 3600 // self.gap_seconds)
        count = int(np.ceil(hours * 3600 / self.gap_seconds))
        return self.available[first:first + count]


def spot_trace_from(data: object, name: str = "trace", option: str = "--trace") -> SpotTrace:
    """A trace from its parsed JSON ``{"metadata": {"gap_seconds": N}, "data": [count, ...]}`` (count > 0: spot)."""
    if not isinstance(data, dict):
        raise SpecError(option, "not a spot trace: expected a JSON object with metadata.gap_seconds and data")
    meta = data.get("metadata")
    gap = meta.get("gap_seconds") if isinstance(meta, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, int | float) or gap <= 0 or gap != int(gap):
        raise SpecError(option, "metadata.gap_seconds must be a positive whole number of seconds")
    counts = data.get("data")
    if not isinstance(counts, list) or not counts:
        raise SpecError(option, "data must be a non-empty list of instance counts")
    if not all(isinstance(c, int | float) and not isinstance(c, bool) for c in counts):
        raise SpecError(option, "data must hold numbers (instances available per tick)")
    return SpotTrace(name=name, gap_seconds=int(gap), available=np.asarray(counts, dtype=float) > 0)


def load_spot_trace(path: str | Path, option: str = "--trace") -> SpotTrace:
    """Read a spot availability trace file (see :func:`spot_trace_from`)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(option, f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SpecError(option, f"{p} is not JSON: {exc}") from None
    return spot_trace_from(data, name=p.stem, option=option)


def spot_trace_files(root: str | Path) -> list[Path]:
    """Every JSON spot trace under a directory (``../shared/data/spot``), sorted."""
    return sorted(Path(root).rglob("*.json"))


@dataclass(frozen=True)
class Pod:
    """One GPU job of a cluster trace: when it arrived, how many GPUs, how long it ran, its QoS class."""

    name: str
    arrival_s: float
    gpus: int
    duration_s: float
    qos: str


POD_COLUMNS = ("name", "num_gpu", "creation_time", "deletion_time")


def load_pods(path: str | Path, option: str = "--pods") -> list[Pod]:
    """GPU pods of an Alibaba ``openb_pod_list_*.csv`` trace, by arrival.

    A pod's run time is ``deletion_time - scheduled_time`` (creation when never scheduled);
    pods without GPUs or without run time are left out: they ask nothing of a GPU pool.
    """
    p = Path(path)
    try:
        fh = p.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise SpecError(option, f"cannot read {p}: {exc.strerror or exc}") from None
    pods: list[Pod] = []
    with fh:
        reader = csv.DictReader(fh)
        missing = [c for c in POD_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise SpecError(option, f"{p} is not a pod trace: no column {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                gpus = int(row["num_gpu"] or 0)
                created = float(row["creation_time"])
                deleted = float(row["deletion_time"])
                started = float(row.get("scheduled_time") or created)
            except ValueError:
                raise SpecError(option, f"{p} line {line}: num_gpu and times must be numbers") from None
            run = deleted - max(started, created)
            if gpus <= 0 or run <= 0:
                continue
            pods.append(Pod(row["name"], created, gpus, run, (row.get("qos") or "").strip()))
    if not pods:
        raise SpecError(option, f"{p} has no GPU pods with a run time")
    pods.sort(key=lambda x: (x.arrival_s, x.name))
    return pods
