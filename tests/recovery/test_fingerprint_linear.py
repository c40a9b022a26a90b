"""A message of many text blocks costs linear time to fingerprint (it was quadratic:
adjacent texts were joined by repeated concatenation)."""

from __future__ import annotations

import time

from proxy.recovery.message_chain import message_fingerprint


def _seconds(blocks: int) -> float:
    message = {"role": "user",
               "content": [{"type": "text", "text": f"block {i:06d} " + "x" * 88}
                           for i in range(blocks)]}
    began = time.perf_counter()
    message_fingerprint(message)
    return time.perf_counter() - began


def test_many_text_blocks_cost_linear_time() -> None:
    _seconds(1000)  # warm
    small = min(_seconds(5_000) for _ in range(3))
    large = min(_seconds(20_000) for _ in range(3))
    # 4x the blocks: 4x the time when linear, 16x when quadratic; generous for noise.
    assert large < 8 * small, (small, large)
