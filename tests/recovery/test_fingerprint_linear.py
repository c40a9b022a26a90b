"""A message of many text blocks costs linear time to fingerprint (it was quadratic:
adjacent texts were joined by repeated concatenation)."""

from __future__ import annotations

import gc
import time

from proxy.recovery.message_chain import message_fingerprint


def _seconds(blocks: int) -> float:
    message = {"role": "user",
               "content": [{"type": "text", "text": f"block {i:06d} " + "x" * 88}
                           for i in range(blocks)]}
    gc.disable()  # a collection landing in one timing, not the other, is not the code's
    try:
        began = time.perf_counter()
        message_fingerprint(message)
        return time.perf_counter() - began
    finally:
        gc.enable()


def test_many_text_blocks_cost_linear_time() -> None:
    _seconds(1000)  # warm
    # The fastest of several: what the code costs, less what a loaded machine added.
    small = min(_seconds(5_000) for _ in range(5))
    large = min(_seconds(20_000) for _ in range(5))
    # 4x the blocks: 4x the time when linear, 16x when quadratic (23x measured before the
    # fix); 10x leaves room for a machine busy with other work.
    assert large < 10 * small, (small, large)
