"""tailfloor: an OpenAI-compatible streaming proxy that keeps a summary plus the last N raw
messages in every request an agent sends."""

__version__ = "0.1.0"
