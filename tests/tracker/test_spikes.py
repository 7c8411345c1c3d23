"""The spike rule (policies.spikes) and the replay of real AWS spot price records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.errors import SpecError
from broker.price_replay import load_records, parse_records, replay, series_of
from policies.spikes import Spike, SpikeDetector, detect_spikes, volatility_per_hour

T0 = datetime(2026, 1, 5, tzinfo=UTC)


def hourly(prices: list[float]) -> list[tuple[datetime, float]]:
    return [(T0 + timedelta(hours=i), p) for i, p in enumerate(prices)]


def test_spike_opens_above_multiple_and_clears_below_clear_multiple() -> None:
    # baseline 1.0; 1.6 > 1.5×1.0 opens; 1.3 is above 1.2× so it stays open; 1.1 clears it.
    spikes = detect_spikes(hourly([1.0, 1.0, 1.0, 1.6, 2.4, 1.3, 1.1, 1.0]), 1.5, 1.2, 12)
    assert spikes == [
        Spike(start=T0 + timedelta(hours=3), end=T0 + timedelta(hours=6), peak=2.4, baseline=1.0)
    ]
    assert spikes[0].ratio == pytest.approx(2.4)


def test_rise_below_the_multiple_and_falls_are_not_spikes() -> None:
    assert detect_spikes(hourly([1.0, 1.4, 1.45, 0.5, 0.2, 0.3]), 1.5, 1.2, 12) == []


def test_open_spike_at_the_end_has_no_end() -> None:
    (spike,) = detect_spikes(hourly([2.0, 2.0, 5.0, 6.0]), 1.5, 1.2, 4)
    assert spike.end is None and spike.peak == 6.0 and spike.baseline == 2.0


def test_spike_points_do_not_raise_their_own_baseline() -> None:
    # A long spike (10 points at 3.0 over a window of 4) stays one spike against the 1.0 baseline.
    spikes = detect_spikes(hourly([1.0] * 4 + [3.0] * 10 + [1.0]), 1.5, 1.2, 4)
    assert len(spikes) == 1 and spikes[0].baseline == 1.0 and spikes[0].end == T0 + timedelta(hours=14)


def test_baseline_is_the_trailing_median_over_the_window() -> None:
    # Old high prices leave the window of 3: the baseline is the median of the last 3 (1.0), not of all.
    spikes = detect_spikes(hourly([4.0, 4.0, 4.0, 1.0, 1.0, 1.0, 2.0]), 1.5, 1.2, 3)
    assert [(s.start, s.baseline) for s in spikes] == [(T0 + timedelta(hours=6), 1.0)]


def test_unsorted_input_is_sorted_by_time() -> None:
    series = hourly([1.0, 1.0, 2.0, 1.0])
    assert detect_spikes(list(reversed(series)), 1.5, 1.2, 12) == detect_spikes(series, 1.5, 1.2, 12)


def test_incremental_detector_resumes_to_the_same_answer_as_one_pass() -> None:
    series = hourly([1.0, 1.1, 0.9, 1.0, 2.5, 2.7, 1.05, 1.0, 1.0, 3.0])
    whole = detect_spikes(series, 1.5, 1.2, 12)
    # First run sees 5 points and leaves a spike open; the second resumes from what a store would hold.
    first = SpikeDetector(1.5, 1.2, 12)
    events = [first.update(at, p) for at, p in series[:5]]
    assert [e.kind for e in events if e] == ["opened"]
    assert first.open is not None
    second = SpikeDetector(1.5, 1.2, 12, history=[1.0, 1.1, 0.9, 1.0], open_spike=first.open)
    kinds = [e.kind for at, p in series[5:] if (e := second.update(at, p))]
    assert kinds == ["closed", "opened"]
    resumed = second.finish()
    assert resumed[0].start == whole[0].start and resumed[0].end == whole[0].end
    assert resumed[0].peak == whole[0].peak == 2.7
    assert resumed[1] == whole[1]


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        SpikeDetector(1.0, 1.0, 12)
    with pytest.raises(ValueError):
        SpikeDetector(1.5, 1.6, 12)
    with pytest.raises(ValueError):
        SpikeDetector(1.5, 1.2, 0)


def test_volatility_is_zero_when_flat_and_grows_with_moves() -> None:
    assert volatility_per_hour(hourly([1.0, 1.0, 1.0])) == 0.0
    assert volatility_per_hour(hourly([1.0])) == 0.0
    calm = volatility_per_hour(hourly([1.0, 1.01, 1.0, 1.01]))
    wild = volatility_per_hour(hourly([1.0, 2.0, 1.0, 2.0]))
    assert 0 < calm < wild


# --------------------------------------------------------------------------- the real records

TSV = "spot/aws-spot-prices-2022-05-31-gpu.tsv"


@pytest.fixture(scope="module")
def real_records(shared_data: Path) -> list:
    return load_records(shared_data / TSV)


def test_real_records_parse(real_records: list) -> None:
    # PROVENANCE.md: 1,594 rows of GPU families, 2022-05-31 18:20-23:59 UTC.
    assert len(real_records) == 1594
    assert min(r.at for r in real_records) >= datetime(2022, 5, 31, 18, 20, tzinfo=UTC)
    assert max(r.at for r in real_records) < datetime(2022, 6, 1, tzinfo=UTC)
    series = series_of(real_records)
    assert len(series) == 1572  # almost every series is a single record over these 5.5 hours
    assert max(len(p) for p in series.values()) == 2


def test_replay_of_the_real_records_flags_nothing_at_the_default_rule(real_records: list) -> None:
    # Looked at by hand: of the 22 series with two records, the largest move is cac1-az1 g4ad.4xlarge
    # Windows, 1.6639 → 1.6885 (+1.5%); g5.48xlarge in use1 *fell*. A 1.5× rule must stay quiet on them.
    assert replay(real_records, 1.5, 1.2, 12) == []


def test_replay_flags_exactly_the_series_that_rose_beyond_a_tight_rule(real_records: list) -> None:
    # With a 1% rule the one series that rose more than 1% is flagged, and none of the flat or falling ones.
    spikes = replay(real_records, 1.01, 1.005, 12)
    assert [s["series"] for s in spikes] == [
        {"zone": "cac1-az1", "sku": "g4ad.4xlarge", "product": "Windows"}
    ]
    (s,) = spikes
    assert s["baseline"] == 1.6639 and s["peak"] == 1.6885 and s["end"] is None
    assert s["start"] == "2022-05-31T23:50:33+00:00"
    # euc1-az2 g4ad.2xlarge rose only 0.3% (0.2871 → 0.2879): flagged by neither rule.
    assert not any(x["series"]["zone"] == "euc1-az2" for x in spikes)


def test_replay_reads_describe_spot_price_history_json() -> None:
    text = """{"SpotPriceHistory": [
      {"AvailabilityZone": "us-east-1a", "InstanceType": "p5.48xlarge", "ProductDescription": "Linux/UNIX",
       "SpotPrice": "40.0", "Timestamp": "2026-01-05T00:00:00Z"},
      {"AvailabilityZone": "us-east-1a", "InstanceType": "p5.48xlarge", "ProductDescription": "Linux/UNIX",
       "SpotPrice": "90.0", "Timestamp": "2026-01-05T01:00:00.000Z"},
      {"AvailabilityZone": "us-east-1b", "InstanceType": "p5.48xlarge", "ProductDescription": "Linux/UNIX",
       "SpotPrice": "41.0", "Timestamp": "2026-01-05T00:00:00Z"}]}"""
    spikes = replay(parse_records(text), 1.5, 1.2, 12)
    assert [(s["series"]["zone"], s["peak"], s["baseline"]) for s in spikes] == [("us-east-1a", 90.0, 40.0)]


@pytest.mark.parametrize("text", ['{"nothing": 1}', "a\tb\n", '{"SpotPriceHistory": [{"SpotPrice": "x"}]}'])
def test_replay_refuses_what_is_not_spot_records(text: str) -> None:
    with pytest.raises(SpecError):
        parse_records(text, "f.json")
