"""``errors.unlinked``: an exception and every one chained to it lose their tracebacks (the
frames they hold), whatever the shape of the chain."""

from __future__ import annotations

from proxy.errors import UpstreamUnavailable, unlinked


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_the_exception_its_cause_and_its_context_lose_their_frames() -> None:
    cause = _raised(ConnectionResetError("reset"))
    context = _raised(TimeoutError("late"))
    outer = _raised(UpstreamUnavailable("broke"))
    outer.__cause__, outer.__context__ = cause, context
    context.__context__ = _raised(OSError("deeper"))
    chain = [outer, cause, context, context.__context__]
    assert all(link.__traceback__ is not None for link in chain)
    assert unlinked(outer) is outer
    assert [link.__traceback__ for link in chain] == [None] * 4
    assert (outer.__cause__, outer.__context__) == (cause, context)  # the chain is kept


def test_a_chain_that_loops_ends() -> None:
    first, second = _raised(ValueError("a")), _raised(KeyError("b"))
    first.__context__, second.__context__ = second, first
    assert unlinked(first) is first
    assert first.__traceback__ is None and second.__traceback__ is None
