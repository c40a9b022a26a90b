"""Traces and metrics over OTLP/HTTP, made from each finished request's report.

Written here, from the OTLP protobuf definitions (protowire.py), and posted over HTTP/1.1
written here too (framing.py, exporting.py): export needs nothing beyond tailfloor itself.
Without the standard OTEL_EXPORTER_OTLP_* variables nothing here starts, and the request path
does nothing more.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from proxy.telemetry.config import TelemetryConfig, asked_for, telemetry_config

if TYPE_CHECKING:
    from collections.abc import Callable

    from proxy.metrics import Metrics
    from proxy.policy.prices import PriceList
    from proxy.telemetry.sink import TelemetrySink

__all__ = ["TelemetryConfig", "asked_for", "start", "telemetry_config"]

log = logging.getLogger("tailfloor.telemetry")


def start(config: TelemetryConfig, metrics: Metrics, upstream_url: str,
          prices: Callable[[], PriceList]) -> TelemetrySink:
    """The sink exporting what ``config`` asks for (its threads started); each value that
    was set but is not used is said once."""
    from proxy.telemetry.sink import TelemetrySink  # only when an export is asked for

    for note in config.notes:
        log.warning("%s", note)
    return TelemetrySink(config, metrics, upstream_url, prices)
