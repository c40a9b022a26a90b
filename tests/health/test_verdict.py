"""What the health process answers from what it has heard of the event loop."""

from __future__ import annotations

import pytest

from proxy.health.verdict import (
    INDEXING,
    NOT_READY,
    READY,
    STARTING,
    Heard,
    answer,
    readiness_byte,
)


def heard(readiness: int | None, asked_at: float | None = None) -> Heard:
    out = Heard()
    if readiness is not None:
        assert out.answered(readiness_byte(readiness))
    out.asked_at = asked_at
    return out


def test_one_question_at_a_time() -> None:
    knows = Heard()
    assert knows.ask(1.0)
    assert not knows.ask(2.0)  # outstanding since 1.0: not asked again
    assert knows.silent_for(3.5) == 2.5
    assert knows.answered(readiness_byte(INDEXING))
    assert knows.readiness == INDEXING and knows.silent_for(9.0) == 0.0
    assert knows.ask(9.0)


def test_an_answer_this_side_does_not_know_still_answers_and_reads_as_not_ready() -> None:
    knows = heard(READY, asked_at=5.0)
    assert not knows.answered(b"")
    assert knows.readiness == READY and knows.asked_at == 5.0
    assert knows.answered(b"\x63")  # no such readiness: the question is answered all the same
    assert knows.readiness == STARTING and knows.asked_at is None
    knows.asked_at = 6.0
    assert knows.answered(bytes((STARTING, INDEXING, READY)))  # the last one counts
    assert knows.readiness == READY and knows.asked_at is None


@pytest.mark.parametrize("case", [
    # started, the loop never heard from: not live yet (a startup probe waits for it)
    (b"GET", b"/healthz", heard(None), 100.0, 503,
     "starting: no answer from the event loop yet\n"),
    (b"HEAD", b"/healthz", heard(READY), 100.0, 200, "ok\n"),
    (b"GET", b"/readyz", heard(READY), 100.0, 200, "ready\n"),
    (b"GET", b"/readyz?verbose=1", heard(READY), 100.0, 200, "ready\n"),
    (b"GET", b"/readyz", heard(None), 100.0, 503,
     "starting: no answer from the event loop yet\n"),
    (b"GET", b"/readyz", heard(INDEXING), 100.0, 503, "not ready: indexing transcripts\n"),
    (b"GET", b"/healthz", heard(INDEXING), 100.0, 200, "ok\n"),  # live, not ready
    (b"GET", b"/healthz", heard(READY, asked_at=90.0), 100.0, 200, "ok\n"),  # at the bound
    (b"GET", b"/healthz", heard(READY, asked_at=89.8), 100.0, 503,
     "not live: the event loop has not answered for 10.2 s\n"),
    (b"GET", b"/readyz", heard(READY, asked_at=89.8), 100.0, 503,
     "not live: the event loop has not answered for 10.2 s\n"),
    (b"POST", b"/healthz", heard(READY), 100.0, 405, "method not allowed\n"),
    (b"GET", b"/metrics", heard(READY), 100.0, 404,
     "not found: this port answers /healthz and /readyz\n"),
    (b"GET", b"/healthz/../metrics", heard(READY), 100.0, 404,
     "not found: this port answers /healthz and /readyz\n"),
])
def test_probe_answers(case: tuple[bytes, bytes, Heard, float, int, str]) -> None:
    method, target, knows, now, status, text = case
    assert answer(method, target, knows, now, stale_after=10.0) == (status, text)


def test_every_not_ready_code_has_its_own_text() -> None:
    for code, text in NOT_READY.items():
        assert answer(b"GET", b"/readyz", heard(code), 0.0, 1.0) == (503, text + "\n")
    assert len(set(NOT_READY.values())) == len(NOT_READY)
