"""The OTLP export the standard environment variables ask for."""

from __future__ import annotations

from proxy.telemetry.config import Sampler, asked_for, telemetry_config

BASE = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}


def test_no_endpoint_no_export() -> None:
    assert telemetry_config({}) is None
    assert telemetry_config({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_EXPORTER": "otlp"}) is None
    assert not asked_for({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "})


def test_base_endpoint_gives_each_signal_its_path() -> None:
    config = telemetry_config(BASE)
    assert config is not None
    assert config.traces_endpoint == "http://collector:4318/v1/traces"
    assert config.metrics_endpoint == "http://collector:4318/v1/metrics"
    assert config.service_name == "tailfloor"
    assert config.sampler == Sampler("parentbased_always_on", 1.0)
    assert config.export_interval == 60.0
    assert config.notes == ()


def test_signal_endpoint_is_the_whole_url_and_alone_turns_export_on() -> None:
    config = telemetry_config({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"})
    assert config is not None
    assert config.traces_endpoint == "http://t:1/x"
    assert config.metrics_endpoint is None
    config = telemetry_config({**BASE, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m/y"})
    assert config is not None and config.metrics_endpoint == "http://m/y"
    assert config.traces_endpoint == "http://collector:4318/v1/traces"


def test_disabled_and_none_exporters() -> None:
    assert telemetry_config({**BASE, "OTEL_SDK_DISABLED": "TRUE"}) is None
    assert telemetry_config({**BASE, "OTEL_SDK_DISABLED": "false"}) is not None
    config = telemetry_config({**BASE, "OTEL_TRACES_EXPORTER": "none"})
    assert config is not None and config.traces_endpoint is None
    assert config.metrics_endpoint is not None
    assert telemetry_config({**BASE, "OTEL_TRACES_EXPORTER": "none",
                             "OTEL_METRICS_EXPORTER": "none"}) is None
    config = telemetry_config({**BASE, "OTEL_METRICS_EXPORTER": "prometheus"})
    assert config is not None and config.metrics_endpoint is None
    assert any("only otlp" in note for note in config.notes)


def test_resource_and_headers_are_percent_decoded_pairs() -> None:
    config = telemetry_config({
        **BASE, "OTEL_SERVICE_NAME": "edge-proxy",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod, team=a%20b,broken",
        "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20sk-canary-123,oops"})
    assert config is not None
    assert config.service_name == "edge-proxy"
    assert config.resource == (("deployment.environment", "prod"), ("team", "a b"))
    assert config.headers == (("Authorization", "Bearer sk-canary-123"),)
    # A malformed header member is reported without its text (it may be a credential).
    assert len(config.notes) == 2
    assert not any("oops" in note or "canary" in note for note in config.notes)
    assert any("'broken'" in note for note in config.notes)


def test_a_header_http_client_would_refuse_is_skipped_and_named_by_its_key_only() -> None:
    # A line break, a character outside Latin-1 or a bad name would make every export
    # raise in the poster thread; the header is left out and said, its value never shown.
    config = telemetry_config({**BASE, "OTEL_EXPORTER_OTLP_HEADERS": (
        "authorization=Bearer%20sk-canary-1%0Ax,ok=1,euro=%E2%82%AC-canary-2,"
        "bad%20name=canary-3,nul=canary-4%00")})
    assert config is not None
    assert config.headers == (("ok", "1"),)
    assert len(config.notes) == 4
    assert not any("canary" in note for note in config.notes)
    assert all(any(f"'{key}'" in note for note in config.notes)
               for key in ("authorization", "euro", "bad name", "nul"))


def test_sampler_and_ratio() -> None:
    def sampler(**env: str) -> Sampler:
        config = telemetry_config({**BASE, **env})
        assert config is not None
        return config.sampler

    assert sampler(OTEL_TRACES_SAMPLER="always_off") == Sampler("always_off")
    assert sampler(OTEL_TRACES_SAMPLER="parentbased_traceidratio",
                   OTEL_TRACES_SAMPLER_ARG="0.25") == Sampler("parentbased_traceidratio", 0.25)
    assert sampler(OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="2") \
        == Sampler("traceidratio", 1.0)
    assert sampler(OTEL_TRACES_SAMPLER="jaeger_remote") == Sampler()


def test_intervals_in_milliseconds_and_unsupported_values_noted() -> None:
    config = telemetry_config({**BASE, "OTEL_METRIC_EXPORT_INTERVAL": "500",
                               "OTEL_EXPORTER_OTLP_TIMEOUT": "abc",
                               "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                               "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"})
    assert config is not None
    assert config.export_interval == 0.5
    assert config.timeout == 10.0
    assert len(config.notes) == 2
    assert any("grpc" in note for note in config.notes)
    assert config.capture_content and config.content_limit == 256 * 1024


def test_content_capture_and_its_limit() -> None:
    assert telemetry_config(BASE).capture_content is False  # type: ignore[union-attr]
    on = {**BASE, "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "True"}
    config = telemetry_config({**on, "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "1000",
                               "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "500"})
    assert config is not None and config.capture_content and config.content_limit == 500
    config = telemetry_config({**on, "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "-3"})
    assert config is not None and config.content_limit == 256 * 1024 and config.notes
    # no spans, no content: the metrics carry none
    config = telemetry_config({**on, "OTEL_TRACES_EXPORTER": "none"})
    assert config is not None and not config.capture_content
