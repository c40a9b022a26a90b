"""Fixtures of the live agent tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.agents.sizing import PiPrompts


@pytest.fixture(scope="session")
def pi_prompt() -> Iterator[PiPrompts]:
    """Each Pi release's fixed prompt, measured once a test session."""
    prompts = PiPrompts()
    yield prompts
    prompts.close()
