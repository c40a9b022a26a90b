"""OTLP export settings, read from the standard OpenTelemetry environment variables.

tailfloor reads them itself, as the specification defines them, so what is exported and
where is decided in one pure function with its own tests. Values the specification defines
but tailfloor cannot honour (gRPC, another exporter) are not errors: the signal keeps its
default and a note says why, as an SDK would warn. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

__all__ = ["Sampler", "TelemetryConfig", "asked_for", "telemetry_config"]

_SAMPLERS = frozenset({"always_on", "always_off", "traceidratio", "parentbased_always_on",
                       "parentbased_always_off", "parentbased_traceidratio"})
_DEFAULT_INTERVAL_MS = 60_000
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name
_DEFAULT_TIMEOUT_MS = 10_000
# Characters of one content attribute when no OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT says: the
# SDK's default is no limit, but one agent request can be megabytes, and a collector refuses
# an export past its own size limit (4 MiB for many).
_CONTENT_LIMIT = 256 * 1024


@dataclass(frozen=True, slots=True)
class Sampler:
    name: str = "parentbased_always_on"
    ratio: float = 1.0  # for the traceidratio samplers


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """What to export where. ``traces_endpoint`` / ``metrics_endpoint``: the full URL the
    signal is posted to, None when that signal is off."""

    traces_endpoint: str | None
    metrics_endpoint: str | None
    service_name: str = "tailfloor"
    resource: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    sampler: Sampler = Sampler()
    export_interval: float = _DEFAULT_INTERVAL_MS / 1000  # seconds between metric exports
    timeout: float = _DEFAULT_TIMEOUT_MS / 1000  # seconds for one export call
    # The batch span processor's settings (OTEL_BSP_*), as the specification defines them.
    schedule_delay: float = 5.0  # seconds between span exports
    max_queue: int = 2048  # spans held for export; more are dropped
    max_batch: int = 512  # spans in one export (at most max_queue)
    export_timeout: float = 30.0  # seconds a span export may take, all of it
    metric_timeout: float = 30.0  # seconds a metric export may take
    delta: bool = False  # metrics as deltas (OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE)
    gzip: bool = False  # OTEL_EXPORTER_OTLP_COMPRESSION=gzip
    certificate: str | None = None  # a CA file for https (OTEL_EXPORTER_OTLP_CERTIFICATE)
    # OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true: what the model was sent
    capture_content: bool = False
    content_limit: int = _CONTENT_LIMIT  # characters of one content attribute
    notes: tuple[str, ...] = ()  # values that were set but are not used, and why


def asked_for(env: Mapping[str, str]) -> bool:
    """The environment asks for an OTLP export (whether or not it can be made)."""
    return any(env.get(name, "").strip() for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))


def telemetry_config(env: Mapping[str, str]) -> TelemetryConfig | None:
    """The export the environment asks for; None when it asks for none (no endpoint,
    ``OTEL_SDK_DISABLED=true``, or both signals' exporters ``none``)."""
    if not asked_for(env) or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    notes: list[str] = []
    protocol = env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip().lower()
    if protocol and protocol != "http/protobuf":
        notes.append(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported; "
                     "exporting over http/protobuf")
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    traces = _endpoint(env, "TRACES", base, "v1/traces", notes)
    metrics = _endpoint(env, "METRICS", base, "v1/metrics", notes)
    if traces is None and metrics is None:
        return None
    capture = env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip() \
        .lower() == "true"
    # The span-specific limit wins over the general one, as in the SDK.
    limit_name = next((name for name in ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
                                         "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")
                       if env.get(name, "").strip()), None)
    limit = _count(env, limit_name, _CONTENT_LIMIT, notes) if limit_name else _CONTENT_LIMIT
    compression = env.get("OTEL_EXPORTER_OTLP_COMPRESSION", "").strip().lower()
    if compression not in ("", "none", "gzip"):
        notes.append(f"OTEL_EXPORTER_OTLP_COMPRESSION={compression} is not supported; "
                     "exporting uncompressed")
    queue = _count(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048, notes)
    batch = _count(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512, notes)
    return TelemetryConfig(
        traces_endpoint=traces, metrics_endpoint=metrics,
        service_name=env.get("OTEL_SERVICE_NAME", "").strip() or "tailfloor",
        resource=_pairs(env.get("OTEL_RESOURCE_ATTRIBUTES", ""), "OTEL_RESOURCE_ATTRIBUTES",
                        notes),
        headers=_pairs(env.get("OTEL_EXPORTER_OTLP_HEADERS", ""), "OTEL_EXPORTER_OTLP_HEADERS",
                       notes, secret=True),
        sampler=_sampler(env, notes),
        export_interval=_millis(env, "OTEL_METRIC_EXPORT_INTERVAL", _DEFAULT_INTERVAL_MS,
                                notes),
        timeout=_millis(env, "OTEL_EXPORTER_OTLP_TIMEOUT", _DEFAULT_TIMEOUT_MS, notes),
        schedule_delay=_millis(env, "OTEL_BSP_SCHEDULE_DELAY", 5000, notes),
        max_queue=queue, max_batch=min(batch, queue),
        export_timeout=_millis(env, "OTEL_BSP_EXPORT_TIMEOUT", 30_000, notes),
        metric_timeout=_millis(env, "OTEL_METRIC_EXPORT_TIMEOUT", 30_000, notes),
        delta=_delta(env, notes), gzip=compression == "gzip",
        certificate=env.get("OTEL_EXPORTER_OTLP_CERTIFICATE", "").strip() or None,
        capture_content=capture and traces is not None, content_limit=limit,
        notes=tuple(notes))


def _endpoint(env: Mapping[str, str], signal: str, base: str, path: str,
              notes: list[str]) -> str | None:
    exporter = env.get(f"OTEL_{signal}_EXPORTER", "otlp").strip().lower() or "otlp"
    names = {name.strip() for name in exporter.split(",")}
    if "none" in names:
        return None
    if "otlp" not in names:
        notes.append(f"OTEL_{signal}_EXPORTER={exporter}: only otlp is supported; "
                     f"{signal.lower()} are not exported")
        return None
    own = env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT", "").strip()
    if own:
        return own  # a signal's own endpoint is the whole URL, by the specification
    if not base:
        return None
    return f"{base.rstrip('/')}/{path}"


def _pairs(raw: str, name: str, notes: list[str], *, secret: bool = False
           ) -> tuple[tuple[str, str], ...]:
    """``key=value,key=value`` with percent-encoded values (W3C Baggage's form, as the
    specification says); a malformed member is skipped."""
    found: list[tuple[str, str]] = []
    for member in raw.split(","):
        if not member.strip():
            continue
        key, sep, value = member.partition("=")
        if not sep or not key.strip():
            # Never the member itself: a header value may be a credential.
            notes.append(f"{name}: a member without key=value is skipped"
                         if secret else f"{name}: {member.strip()!r} is not key=value")
            continue
        key, value = unquote(key.strip()), unquote(value.strip())
        if secret and not _sendable(key, value):
            # Named by its key only: the value may be a credential.
            notes.append(f"{name}: header {key[:64]!r} is skipped (not a header name, or a "
                         "value with a line break, NUL or a character outside Latin-1)")
            continue
        found.append((key, value))
    return tuple(found)


def _sendable(name: str, value: str) -> bool:
    """What a request head can carry unchanged (framing.py refuses the rest)."""
    if not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\x00"):
        return False
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def _sampler(env: Mapping[str, str], notes: list[str]) -> Sampler:
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    if name not in _SAMPLERS:
        notes.append(f"OTEL_TRACES_SAMPLER={name} is not supported; using "
                     "parentbased_always_on")
        return Sampler()
    if not name.endswith("traceidratio"):
        return Sampler(name)
    raw = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    try:
        ratio = float(raw) if raw else 1.0
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        notes.append(f"OTEL_TRACES_SAMPLER_ARG={raw!r} is not a ratio from 0 to 1; using 1.0")
        ratio = 1.0
    return Sampler(name, ratio)


def _millis(env: Mapping[str, str], name: str, default: int, notes: list[str]) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default / 1000
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        notes.append(f"{name}={raw!r} is not a positive number of milliseconds; using "
                     f"{default}")
        value = default
    return value / 1000


def _count(env: Mapping[str, str], name: str, default: int, notes: list[str]) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        notes.append(f"{name}={raw!r} is not a positive number; using {default}")
        return default
    return value


def _delta(env: Mapping[str, str], notes: list[str]) -> bool:
    """Cumulative, the specification's default for OTLP; ``delta`` and ``lowmemory`` ask
    for deltas (tailfloor's counters and histograms are all of the kinds both make delta)."""
    raw = env.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "").strip().lower()
    if raw in ("", "cumulative"):
        return False
    if raw in ("delta", "lowmemory"):
        return True
    notes.append(f"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE={raw} is not "
                 "cumulative, delta or lowmemory; using cumulative")
    return False
