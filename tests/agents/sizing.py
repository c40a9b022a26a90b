"""Sizes taken from what the agent really sends, never fitted to today's prompt.

A Pi release's fixed prompt (system prompt and tool schemas) changes between releases, so a
window or an overflow threshold written as a constant turns a test red when a patch release
adds a paragraph. ``PiPrompts`` measures each release once per test session, the way the
fake upstream measures every request (``size_usage``, ``total_chars``), from one print-mode
turn sent straight to a fake of its own; tests add the room their scenario needs on top.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

from tests.agents.pi_agent import PiAgent, release
from tests.conftest import ThreadedFake
from tests.fake_behaviour import AgentBehaviour, size_usage, total_chars

PROBE = "Hello."


@dataclass(frozen=True)
class PromptSize:
    """A release's first request for ``PROBE``: the fake's token measure and text characters."""

    tokens: int
    chars: int


class PiPrompts:
    def __init__(self) -> None:
        self._sizes: dict[str, PromptSize] = {}
        self._fake: ThreadedFake | None = None

    def __call__(self, version: str) -> PromptSize:
        if version not in self._sizes:
            self._sizes[version] = self._measure(version)
        return self._sizes[version]

    def _measure(self, version: str) -> PromptSize:
        if self._fake is None:
            self._fake = ThreadedFake()
        fake = self._fake.fake
        fake.reset()
        fake.behaviour = AgentBehaviour()
        with tempfile.TemporaryDirectory(prefix="pi-probe-") as home:
            PiAgent(Path(home), fake.url + "/v1", pi=release(version)).turn(PROBE)
        requests = fake.chat_requests()
        if len(requests) != 1:
            raise AssertionError(f"Pi {version}'s probe turn sent {len(requests)} requests")
        body = orjson.loads(requests[0].body)
        return PromptSize(size_usage(body, "")["prompt_tokens"], total_chars(body["messages"]))

    def close(self) -> None:
        if self._fake is not None:
            self._fake.stop()
