"""Silent overflow signs in normal-looking answers."""

from __future__ import annotations

import pytest

from proxy.recovery.silent import (
    check_silent_overflow,
    length_without_output,
    prompt_over_window,
    truncated_prompt,
)


@pytest.mark.parametrize(("finish", "prompt", "window", "expected"), [
    ("stop", 8193, 8192, True),
    ("tool_calls", 9000, 8192, True),
    ("stop", 8192, 8192, False),  # exactly full is not over
    ("length", 9000, 8192, False),  # a length stop is the other check
    (None, 9000, 8192, False),
    ("stop", None, 8192, False),
    ("stop", 9000, 0, False),
])
def test_prompt_over_window(finish: str | None, prompt: int | None, window: int,
                            expected: bool) -> None:
    assert prompt_over_window(finish, prompt, window) is expected


@pytest.mark.parametrize(("finish", "prompt", "completion", "window", "expected"), [
    ("length", 8111, 0, 8192, True),  # 8111 >= 0.99 * 8192 = 8110.08
    ("length", 8110, 0, 8192, False),
    ("length", 8192, 1, 8192, False),  # it produced something
    ("stop", 8192, 0, 8192, False),
    ("max_tokens", 100_000, 0, 100_000, True),
    ("length", 8192, None, 8192, False),  # no usage: unknown, not overflow
])
def test_length_without_output(finish: str, prompt: int, completion: int | None, window: int,
                               expected: bool) -> None:
    assert length_without_output(finish, prompt, completion, window) is expected


@pytest.mark.parametrize(("prompt", "estimate", "window", "expected"), [
    (2048, 9000, 2048, True),  # Ollama kept num_ctx tokens of our 9000
    (4400, 9000, 8192, True),
    (4600, 9000, 8192, False),  # more than half arrived: a tokenizer difference
    (1000, 3000, 8192, False),  # we were under the window: nothing to cut
    (None, 9000, 2048, False),
])
def test_truncated_prompt(prompt: int | None, estimate: int, window: int, expected: bool) -> None:
    assert truncated_prompt(prompt, estimate, window) is expected


def test_check_silent_overflow_reports_the_first_sign() -> None:
    over = check_silent_overflow("stop", 9000, 20, 8192, estimate=8000)
    assert over is not None and over.kind == "prompt_over_window"
    assert (over.window, over.prompt_tokens, over.estimate) == (8192, 9000, 8000)
    full = check_silent_overflow("length", 8150, 0, 8192)
    assert full is not None and full.kind == "length_without_output"
    cut = check_silent_overflow("stop", 2048, 30, 2048, estimate=7000)
    assert cut is not None and cut.kind == "truncated"
    assert check_silent_overflow("stop", 3000, 30, 8192, estimate=3100) is None
    assert check_silent_overflow("stop", 9000, 30, None) is None
    assert check_silent_overflow("stop", None, None, 8192) is None
    zai = check_silent_overflow("model_context_window_exceeded", None, 0, None)
    assert zai is not None and zai.kind == "overflow_finish"
