"""Traces and metrics over OTLP/HTTP, made from each finished request's report.

The OpenTelemetry SDK is an optional extra (``tailfloor[otel]``): nothing here imports it
until ``start`` is asked for an export, so without the extra, or without the variables,
tailfloor neither imports nor does anything more.
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
          prices: Callable[[], PriceList]) -> TelemetrySink | None:
    """The sink exporting what ``config`` asks for; None (said in one line) when the
    ``otel`` extra is not installed."""
    try:
        from proxy.telemetry.sink import TelemetrySink
    except ImportError as exc:
        log.warning("OTEL_EXPORTER_OTLP_* is set but the OpenTelemetry SDK is not installed "
                    "(pip install 'tailfloor[otel]'): nothing is exported (%s)", exc.name)
        return None
    for note in config.notes:
        log.warning("%s", note)
    return TelemetrySink(config, metrics, upstream_url, prices)
