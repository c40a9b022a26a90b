"""The tests' metric reader: a series not counted yet reads 0, a metric that does not exist
fails (a renamed metric must not pass an ``== 0`` assertion)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from tests.conftest import registry_sample


def test_absent_metrics_fail_and_uncounted_series_read_zero() -> None:
    registry = CollectorRegistry()
    counter = Counter("demo_events", "events", ["kind"], registry=registry)
    Histogram("demo_seconds", "time", registry=registry).observe(0.2)
    assert registry_sample(registry, "demo_events_total", kind="a") == 0
    counter.labels(kind="a").inc(3)
    assert registry_sample(registry, "demo_events_total", kind="a") == 3
    assert registry_sample(registry, "demo_events_total", kind="b") == 0
    assert registry_sample(registry, "demo_seconds_count") == 1
    for missing in ("demo_event_total", "demo_events", "other_total", "demo_seconds_total"):
        with pytest.raises(AssertionError, match="exports no metric"):
            registry_sample(registry, missing)
