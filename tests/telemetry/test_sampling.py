"""The specification's samplers, decided by tailfloor; and the export imports no SDK."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from proxy.telemetry.config import Sampler
from proxy.telemetry.sampling import TraceSampler
from proxy.telemetry.tracecontext import TraceContext, parse_traceparent

HIGH = "ffffffffffffffff"  # the upper 64 bits never count


def trace(low: int) -> str:
    return f"{HIGH}{low:016x}"


def client(flags: str) -> TraceContext:
    return TraceContext(trace(0), "00f067aa0ba902b7", flags)


def test_always_on_and_off_ignore_the_client() -> None:
    on, off = TraceSampler(Sampler("always_on")), TraceSampler(Sampler("always_off"))
    for context in (None, client("00"), client("01")):
        assert on.sampled(trace(2**63), context)
        assert not off.sampled(trace(0), context)


def test_traceidratio_compares_the_lower_64_bits_with_ratio_times_2_64() -> None:
    quarter = TraceSampler(Sampler("traceidratio", 0.25))
    bound = 2**62  # 0.25 * 2**64
    assert quarter.sampled(trace(0), None)
    assert quarter.sampled(trace(bound - 1), None)
    assert not quarter.sampled(trace(bound), None)
    assert not quarter.sampled(trace(2**64 - 1), None)
    assert quarter.sampled("0" * 16 + f"{bound - 1:016x}", None)
    # Not parent-based: the client's flag does not count.
    assert not quarter.sampled(trace(bound), client("01"))
    assert TraceSampler(Sampler("traceidratio", 1.0)).sampled(trace(2**64 - 1), None)
    assert not TraceSampler(Sampler("traceidratio", 0.0)).sampled(trace(0), None)
    # About the ratio over many ids.
    tenth = TraceSampler(Sampler("traceidratio", 0.1))
    kept = sum(tenth.sampled(TraceContext.new().trace_id, None) for _ in range(20_000))
    assert 1_600 < kept < 2_400


def test_parentbased_follows_the_clients_flag_else_its_root() -> None:
    for root in ("always_on", "always_off", "traceidratio"):
        sampler = TraceSampler(Sampler(f"parentbased_{root}", 0.0))
        assert sampler.sampled(trace(2**64 - 1), client("01"))
        assert not sampler.sampled(trace(0), client("00"))
    assert TraceSampler(Sampler("parentbased_always_on")).sampled(trace(5), None)
    assert not TraceSampler(Sampler("parentbased_always_off")).sampled(trace(5), None)
    ratio = TraceSampler(Sampler("parentbased_traceidratio", 0.5))
    assert ratio.sampled(trace(2**63 - 1), None)
    assert not ratio.sampled(trace(2**63), None)
    # A context without a parent (one tailfloor started) is no parent.
    assert not TraceSampler(Sampler("parentbased_always_off")).sampled(
        trace(0), TraceContext(trace(0), None, "01"))


def test_the_context_sent_upstream_carries_the_decision() -> None:
    off = TraceSampler(Sampler("always_off"))
    made = off.context(None)
    assert made.flags == "00" and made.parent_id is None and len(made.trace_id) == 32
    assert off.context(client("01")) == client("01")._replace(flags="00")
    on = TraceSampler(Sampler("parentbased_always_on"))
    assert on.context(client("00")) == client("00")
    assert on.context(None).flags == "01"


def test_new_traces_and_child_spans_are_valid_traceparents() -> None:
    sampler = TraceSampler(Sampler("always_on"))
    seen_traces, seen_spans = set(), set()
    for _ in range(500):
        made = sampler.context(None)
        assert isinstance(made, TraceContext) and made.parent_id is None
        header = made.child()
        parsed = parse_traceparent(header)  # the same reader a client's header meets
        assert parsed is not None and parsed.trace_id == made.trace_id
        assert parsed.parent_id is not None and parsed.flags == "01"
        assert header == made.traceparent(parsed.parent_id)
        seen_traces.add(made.trace_id)
        seen_spans.add(parsed.parent_id)
    assert len(seen_traces) == len(seen_spans) == 500


def test_the_export_needs_no_opentelemetry_package() -> None:
    """With every ``opentelemetry`` package unimportable (redis imports the SDK when it is
    there, for its own metrics, and does without it), a sink starts, describes a request
    and stops; and no module of tailfloor's names one."""
    probe = """
import sys
for name in [m for m in sys.modules if m.startswith('opentelemetry')] + ['opentelemetry']:
    sys.modules[name] = None
import proxy.server.app
from proxy.metrics import Metrics
from proxy.policy.prices import PriceList
from proxy.report import RequestReport
from proxy.telemetry.config import telemetry_config
from proxy.telemetry.sink import TelemetrySink
config = telemetry_config({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
sink = TelemetrySink(config, Metrics(), "http://127.0.0.1:8", PriceList)
sink.keep(RequestReport("r", 0.0, "chat_completions", "m", None, False, 200, "none", 0.1,
                        0.01))
sink.shutdown()
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    root = Path(__file__).resolve().parents[2] / "proxy"
    named = [str(path) for path in root.rglob("*.py") if any(
        isinstance(node, ast.Import | ast.ImportFrom) and "opentelemetry" in ast.dump(node)
        for node in ast.walk(ast.parse(path.read_text())))]
    assert named == []
