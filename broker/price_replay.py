"""Replay recorded spot prices through the spike rule.

Reads DescribeSpotPriceHistory-shaped JSON (``{"SpotPriceHistory": [{"AvailabilityZone",
"InstanceType", "ProductDescription", "SpotPrice", "Timestamp"}, ...]}``, as ``aws ec2
describe-spot-price-history`` prints it) or the headerless TSV of public price
dumps (``AZ  InstanceType  ProductDescription  SpotPrice  Timestamp``), groups the
records into series (zone, instance type, product) and runs
:func:`policies.spikes.detect_spikes` over each.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from broker.errors import SpecError
from broker.models import as_utc
from policies.spikes import Spike, detect_spikes

ReplayKey = tuple[str, str, str]  # (zone, instance type, product description)


@dataclass(frozen=True, slots=True)
class SpotRecord:
    zone: str
    sku: str
    product: str
    price: float
    at: datetime


def parse_records(text: str, source: str = "input") -> list[SpotRecord]:
    """Records from JSON or TSV text; SpecError naming ``source`` when neither reads."""
    stripped = text.lstrip()
    out: list[SpotRecord] = []
    try:
        if stripped.startswith(("{", "[")):
            data: Any = json.loads(text)
            rows = data.get("SpotPriceHistory") if isinstance(data, dict) else data
            if not isinstance(rows, list):
                raise SpecError(source, "JSON without a SpotPriceHistory list")
            for r in rows:
                out.append(
                    SpotRecord(
                        str(r["AvailabilityZone"]),
                        str(r["InstanceType"]),
                        str(r.get("ProductDescription", "")),
                        float(r["SpotPrice"]),
                        as_utc(str(r["Timestamp"])),
                    )
                )
        else:
            for n, row in enumerate(csv.reader(io.StringIO(text), delimiter="\t"), start=1):
                if not row or not "".join(row).strip():
                    continue
                if len(row) < 5:
                    raise SpecError(source, f"line {n}: expected 5 tab-separated fields, got {len(row)}")
                out.append(SpotRecord(row[0], row[1], row[2], float(row[3]), as_utc(row[4])))
    except SpecError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SpecError(source, f"not spot price records ({type(exc).__name__}: {str(exc)[:80]})") from None
    return out


def load_records(path: str | Path) -> list[SpotRecord]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(str(path), exc.strerror or "cannot read") from None
    return parse_records(text, source=str(path))


def series_of(records: list[SpotRecord]) -> dict[ReplayKey, list[tuple[datetime, float]]]:
    out: dict[ReplayKey, list[tuple[datetime, float]]] = {}
    for r in records:
        out.setdefault((r.zone, r.sku, r.product), []).append((r.at, r.price))
    for pts in out.values():
        pts.sort(key=lambda p: p[0])
    return out


def replay(
    records: list[SpotRecord], multiple: float, clear_multiple: float, window: int
) -> list[dict[str, Any]]:
    """Spikes flagged in the records, as JSON-ready dicts sorted by (start, series)."""
    flagged: list[tuple[ReplayKey, Spike]] = []
    for key, pts in series_of(records).items():
        flagged.extend((key, s) for s in detect_spikes(pts, multiple, clear_multiple, window))
    flagged.sort(key=lambda ks: (ks[1].start, ks[0]))
    return [
        {
            "series": {"zone": k[0], "sku": k[1], "product": k[2]},
            "start": s.start.isoformat(),
            "end": s.end.isoformat() if s.end else None,
            "peak": s.peak,
            "baseline": s.baseline,
            "ratio": round(s.ratio, 4),
        }
        for k, s in flagged
    ]
