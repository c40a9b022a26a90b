"""What overflow recovery did, as values: the stage returns them, the exchange records them.

    Compaction    a request that goes upstream compacted (a summary replaces its prefix) or
                  with a stored compaction applied again
    Prepared      what preflight changed: a compaction, a lowered output limit, or both (a
                  stored compaction applied, then the output lowered to fit)
    ErrorStep     what to do with an error answer: retry with a compaction, answer the
                  client with a reply of our own, or pass the upstream's answer on
    AfterCheck    what a complete answer showed: an overflow recovered, a silent overflow,
                  an overflow error inside a stream
"""

from __future__ import annotations

from typing import Any, Literal

from proxy.answer import ErrorReply
from proxy.recovery.detect import OverflowVerdict
from proxy.recovery.output import OutputClamp
from proxy.recovery.silent import SilentOverflow
from proxy.report import Origin
from proxy.values import frozen_value

__all__ = ["AfterCheck", "Compaction", "ErrorStep", "OverflowOutcome", "Prepared",
           "SummaryAttempt", "Trigger"]

Trigger = Literal["preflight", "overflow", "reused"]  # tailfloor_compactions_total{trigger}
OverflowOutcome = Literal["recovered", "clamped", "failed", "passthrough", "mid_stream",
                          "silent"]
Message = dict[str, Any]


@frozen_value
class SummaryAttempt:
    """One summary asked of the summarizing model (all its chunk calls)."""

    model: str
    seconds: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failure: str | None = None  # SummarizerError kind; None: a summary was made
    detail: str = ""
    began: float = 0.0  # perf_counter() when the first call went out (0: none did)
    traceparent: str | None = None  # what its calls sent upstream (spans are exported)


@frozen_value
class Compaction:
    """A request compacted (or given a stored compaction) before it goes upstream."""

    body: bytes
    messages: tuple[Message, ...]
    trigger: Trigger
    label: str  # its part of x-tailfloor: compacted:preflight, reused, dropped:overflow...
    why: str
    session: str
    replaced: int  # conversation messages a summary (or the fallback note) replaced
    kept: int
    tokens_removed: int  # estimated, in the upstream's units as far as we can tell
    window: int
    summary: SummaryAttempt | None = None
    store_error: str | None = None  # the summary was used but could not be stored
    origins: tuple[Origin, ...] | None = None  # where each of ``messages`` came from

    @property
    def retry(self) -> bool:
        """Made for the retry after an overflow error."""
        return self.label.endswith(":overflow")


@frozen_value
class Prepared:
    compaction: Compaction | None = None
    clamp: OutputClamp | None = None  # its body is the one sent (the compaction's, lowered)


@frozen_value
class ErrorStep:
    action: Literal["retry", "reply", "pass"]
    compaction: Compaction | None = None  # retry: what to send
    clamp: OutputClamp | None = None  # retry: what was sent, its output lowered
    reply: ErrorReply | None = None  # reply: the answer the client gets instead
    overflow: OverflowOutcome | None = None  # counted for this answer (failed, passthrough)
    verdict: OverflowVerdict | None = None
    learned_window: int | None = None  # the error taught the model's window
    learned_ratio: float | None = None  # ...or a new token ratio (upstream's count / ours)
    note: str = ""  # why, for the log

    @classmethod
    def passed(cls, **kw: Any) -> ErrorStep:
        return cls("pass", **kw)


@frozen_value
class AfterCheck:
    overflow: OverflowOutcome | None = None  # mid_stream | silent
    silent: SilentOverflow | None = None
    recovered: bool = False  # the compacted retry after an overflow error was answered
    clamped: bool = False  # the retry with its output lowered was answered
    learned_ratio: float | None = None  # the usage taught a new token ratio
