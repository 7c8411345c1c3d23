"""The tracker against moto's EC2 server: spot price history, stored once, polled incrementally."""

from __future__ import annotations

from datetime import UTC, datetime

from broker.config import Settings, TrackerConfig
from broker.models import Market
from broker.store import Store
from broker.tracker import Tracker
from providers.aws import AwsProvider
from providers.aws.config import AwsConfig
from providers.catalog.client import aws_instance_info
from tests.plugins.moto import FaultProxy

# moto answers every DescribeSpotPriceHistory with one record per (type, AZ) it offers: price 0.00001,
# time 2006-01-02T15:04:05.999999999Z, whatever StartTime says (it ignores it, and pagination).
MOTO_TIME = datetime(2006, 1, 2, 15, 4, 5, tzinfo=UTC)


def settings_for(aws: AwsConfig) -> Settings:
    # Retention must reach back to 2006, or the tracker would (rightly) drop moto's points as too old to keep.
    return Settings(aws=aws, tracker=TrackerConfig(retention_days=365 * 40))


async def test_first_run_stores_the_history_and_second_run_stores_nothing_new(
    store: Store, aws_config: AwsConfig, clock
) -> None:
    aws = AwsProvider(aws_config)
    tracker = Tracker(settings_for(aws_config), store, {"aws": aws}, clock=clock)
    try:
        first = await tracker.run_once()
        assert first.leader and first.errors == []
        src = first.sources["aws"]
        assert src.seen > 50 and src.stored == src.seen  # one new series per (GPU type, AZ)
        history = store.price_history(provider="aws")
        assert len(history) == src.seen
        assert {p.market for p in history} == {Market.spot}
        assert {p.usd_per_hour for p in history} == {0.00001}
        assert {p.at.replace(microsecond=0).astimezone(UTC) for p in history} == {MOTO_TIME}
        assert {p.region for p in history} == {"us-east-1"}
        assert all(p.zone.startswith("us-east-1") for p in history)
        # The GPU model is filled in from the instance type (and agrees with the bundled catalog).
        by_sku = {p.sku: p.gpu for p in history}
        assert by_sku["p5.48xlarge"] == "H100-SXM" and by_sku["g5.xlarge"] == "A10G"
        for sku, gpu in by_sku.items():
            info = aws_instance_info(sku)
            assert info is None or info["gpu"] == gpu, sku
        last = store.last_seen("aws", "us-east-1")
        assert last is not None and last.replace(microsecond=0) == MOTO_TIME

        # Second run starts at that last point. moto sends the very same records again (same 2006 time,
        # same price); none is newer than its series' latest point, so the store keeps none of them.
        clock.advance(minutes=5)
        second = await tracker.run_once()
        assert second.sources["aws"].seen == src.seen
        assert second.sources["aws"].stored == 0
        assert len(store.price_history(provider="aws")) == src.seen
        assert second.spikes_opened == 0 and store.alerts() == []
    finally:
        await aws.aclose()


async def test_default_retention_drops_points_older_than_it(
    lite_store: Store, aws_config: AwsConfig, clock
) -> None:
    aws = AwsProvider(aws_config)
    try:
        report = await Tracker(Settings(aws=aws_config), lite_store, {"aws": aws}, clock=clock).run_once()
        assert report.sources["aws"].seen > 50
        assert report.sources["aws"].stored == 0  # 2006 is far beyond the 90-day retention
        assert lite_store.price_history(provider="aws") == []
    finally:
        await aws.aclose()


async def test_a_refused_region_is_reported_and_does_not_stop_the_run(
    lite_store: Store, aws_proxy_config: AwsConfig, aws_faults: FaultProxy, clock
) -> None:
    aws_faults.fail("DescribeSpotPriceHistory", "UnauthorizedOperation")
    aws = AwsProvider(aws_proxy_config)
    try:
        report = await Tracker(
            settings_for(aws_proxy_config), lite_store, {"aws": aws}, clock=clock
        ).run_once()
    finally:
        await aws.aclose()
    assert report.sources["aws"].seen == 0 and report.sources["aws"].stored == 0
    assert len(report.errors) == 1
    assert "UnauthorizedOperation" in report.errors[0] and "us-east-1" in report.errors[0]
    assert "testing" not in report.errors[0]  # the (dummy) credentials never reach a message
    assert aws_faults.actions("DescribeSpotPriceHistory")  # the call was really made
