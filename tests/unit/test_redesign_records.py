"""Small records and memories of the request path: exactly what each one promises."""

from __future__ import annotations

import asyncio

import orjson

from proxy.answer import AnswerSeen
from proxy.chat import ChatRequest, Draft
from proxy.facts.learned import TokenRatios
from proxy.facts.resolve import ModelFactsResolver
from proxy.recovery.locks import SessionLocks
from proxy.upstream.stream_options import StreamOptionsMemory, names_stream_options
from proxy.wire.usage import Usage


def test_usage_that_is_not_reported_is_none_not_zero() -> None:
    usage = Usage.from_dict({"completion_tokens": 5})
    assert usage.prompt_tokens is None and usage.input_tokens is None
    assert usage.completion_tokens == 5
    assert Usage.from_dict({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}
                           ).input_tokens == 6


def test_an_answer_without_prompt_tokens_is_no_silent_overflow() -> None:
    """A missing prompt count once read as 0, "a truncated prompt", and compacted the
    session's next request for nothing."""
    from proxy.context import build_context
    from proxy.facts.learned import LearnedWindows
    from proxy.policy.records import ModelSpec, RuleSet
    from proxy.recovery.stage import Recovery
    from proxy.tokens import TokenCounter

    rules = RuleSet(models=(ModelSpec("fake*", 1000, "estimate", 0.0),))

    class Holder:
        def __init__(self) -> None:
            self.rules = rules

    async def inline(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        return fn(*args, **kwargs)

    recovery = Recovery(rules=Holder(), tokens=TokenCounter(),
                        models=ModelFactsResolver(LearnedWindows(), TokenRatios(), "u"),
                        transport=None, offload=inline)  # type: ignore[arg-type]
    recovery._store = object()  # type: ignore[assignment]  # view() needs a store only
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "x" * 5000}]}
    chat = ChatRequest.parse(orjson.dumps(body), body, None)
    ctx = build_context(chat, {}, rules, sessions=None,
                        models=ModelFactsResolver(LearnedWindows(), TokenRatios(), "u"))
    view = recovery.view(ctx, Draft(chat.raw))
    assert view is not None and ctx.known_window == 1000
    unreported = AnswerSeen(200, Usage.from_dict({"completion_tokens": 3}), "stop", None)
    assert recovery.after_answer(view, None, unreported).silent is None
    truncated = AnswerSeen(200, Usage.from_dict({"prompt_tokens": 10, "completion_tokens": 3}),
                           "stop", None)
    assert recovery.after_answer(view, None, truncated).silent is not None


def test_stream_options_refusals_are_remembered_per_upstream_and_expire() -> None:
    now = [0.0]
    memory = StreamOptionsMemory(clock=lambda: now[0])
    memory.refused("http://a")
    assert not memory.accepted("http://a") and memory.accepted("http://b")
    now[0] = 601.0
    assert memory.accepted("http://a")


def test_only_an_error_that_refuses_stream_options_counts() -> None:
    refusals = [
        {"error": {"message": "Unrecognized request argument supplied: stream_options"}},
        {"error": {"message": "x", "param": "stream_options"}},
        {"error": "stream_options is not supported by this model"},
    ]
    others = [
        {"error": {"message": "'stream_options.include_usage' must be a boolean",
                   "param": "stream_options.include_usage"}},
        {"error": {"message": "Invalid value for temperature"}},
    ]
    assert all(names_stream_options(orjson.dumps(b)) for b in refusals)
    assert not any(names_stream_options(orjson.dumps(b)) for b in others)


def test_a_held_session_lock_is_never_dropped() -> None:
    """A size-bounded map of locks once evicted a held lock, so two summaries of a session
    ran at once; these locks live exactly as long as someone holds or awaits them."""
    async def scenario() -> list[str]:
        locks = SessionLocks()
        order: list[str] = []
        release = asyncio.Event()

        async def first() -> None:
            async with locks.hold("s") as contended:
                assert not contended
                order.append("first in")
                await release.wait()
                order.append("first out")

        async def second() -> None:
            async with locks.hold("s") as contended:
                assert contended
                order.append("second in")

        one = asyncio.create_task(first())
        await asyncio.sleep(0)
        two = asyncio.create_task(second())
        # Thousands of other sessions come and go meanwhile.
        for i in range(5000):
            async with locks.hold(f"other-{i}"):
                pass
        await asyncio.sleep(0)
        assert order == ["first in"]
        release.set()
        await asyncio.gather(one, two)
        assert len(locks) == 0
        return order

    assert asyncio.run(scenario()) == ["first in", "first out", "second in"]
