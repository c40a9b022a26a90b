"""Traces and metrics over OTLP/HTTP (the optional ``otel`` extra)."""
