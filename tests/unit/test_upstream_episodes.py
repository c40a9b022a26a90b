"""What the operator reads of upstream failures: one warning an episode, none for the
episodes of a kind warned about lately (an upstream that fails one answer in ten), and the
count of what went unlogged in the next warning. The oracle is the log records."""

from __future__ import annotations

import logging

import pytest

from proxy.server.upstream_episodes import QUIET, UpstreamEpisodes


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def watched(caplog: pytest.LogCaptureFixture) -> tuple[UpstreamEpisodes, Clock]:
    """Episodes on a clock of the test's, their lines captured."""
    caplog.set_level(logging.INFO, logger="tailfloor.upstream")
    clock = Clock()
    return UpstreamEpisodes("http://up", clock=clock), clock


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    found = [(r.levelno, r.getMessage()) for r in caplog.records
             if r.name == "tailfloor.upstream"]
    caplog.clear()
    return found


def test_a_run_of_failures_is_one_warning_and_one_line_when_it_answers(
        caplog: pytest.LogCaptureFixture, watched: tuple[UpstreamEpisodes, Clock]) -> None:
    episodes, _clock = watched
    for _ in range(5):
        episodes.failed("connect", "refused")
    episodes.answered(200)
    [(level, warned), (info, again)] = lines(caplog)
    assert level == logging.WARNING and "failed (connect): refused" in warned
    assert info == logging.INFO and "answers again (4 more connect failures" in again


def test_failures_now_and_then_are_one_warning_per_quiet_period(
        caplog: pytest.LogCaptureFixture, watched: tuple[UpstreamEpisodes, Clock]) -> None:
    episodes, clock = watched
    for _ in range(50):  # one answer in ten cut off, ten a second
        for _ in range(9):
            episodes.answered(200)
            clock.now += 0.1
        episodes.failed("mid_stream", "cut")
        clock.now += 0.1
    found = lines(caplog)
    assert [level for level, _ in found] == [logging.WARNING, logging.INFO]
    clock.now += QUIET
    episodes.answered(200)
    episodes.failed("mid_stream", "cut")
    [(level, warned)] = lines(caplog)
    assert level == logging.WARNING
    assert warned.endswith("(49 more since the last warning were only counted)")


def test_another_kind_is_warned_at_once_and_a_quiet_episode_adds_its_failures(
        caplog: pytest.LogCaptureFixture, watched: tuple[UpstreamEpisodes, Clock]) -> None:
    episodes, clock = watched
    episodes.failed("mid_stream", "cut")
    episodes.answered(200)
    episodes.failed("mid_stream", "cut")  # quiet: warned a moment ago
    episodes.failed("mid_stream", "cut")
    episodes.failed("connect", "refused")  # another kind: warned, and not "answers again"
    found = lines(caplog)
    assert [m.split(": ", 1)[0] for _, m in found] == [
        "the upstream http://up failed (mid_stream)", "the upstream http://up answers again "
        "(0 more mid_stream failures were only counted)",
        "the upstream http://up failed (connect)"]
    clock.now += QUIET + 1
    episodes.failed("mid_stream", "cut")
    [(_, warned)] = lines(caplog)
    assert warned.endswith("(2 more since the last warning were only counted)")


def test_an_outage_that_begins_inside_the_quiet_time_is_warned_when_it_is_over(
        caplog: pytest.LogCaptureFixture, watched: tuple[UpstreamEpisodes, Clock]) -> None:
    episodes, clock = watched
    episodes.failed("connect", "refused")
    episodes.answered(200)
    lines(caplog)
    clock.now += 60
    for _ in range(3600):  # down for an hour, a failure a second
        episodes.failed("connect", "refused")
        clock.now += 1
    warned = [m for level, m in lines(caplog) if level == logging.WARNING]
    # once, when the quiet time after the last warning is over: one episode, one warning
    assert len(warned) == 1
    assert warned[0].endswith(f"({int(QUIET) - 60} more since the last warning were "
                              "only counted)")
    episodes.answered(200)
    [(level, again)] = lines(caplog)
    assert level == logging.INFO
    assert again.endswith(f"answers again ({3600 - int(QUIET) + 60 - 1} more connect "
                          "failures were only counted)")


def test_what_a_warned_episode_counted_is_told_when_another_kind_ends_it(
        caplog: pytest.LogCaptureFixture, watched: tuple[UpstreamEpisodes, Clock]) -> None:
    episodes, clock = watched
    episodes.failed("timeout", "slow")  # warned
    clock.now += 10
    for _ in range(3):
        episodes.failed("connect", "refused")  # warned, then two counted
    clock.now += 1
    episodes.failed("timeout", "slow")  # quiet: warned 11 s ago
    episodes.answered(200)
    found = lines(caplog)
    assert [level for level, _ in found] == [logging.WARNING, logging.WARNING, logging.INFO]
    assert found[-1][1].endswith("answers again (3 more failures were only counted: "
                                 "2 connect, 1 timeout)")


def test_a_hint_follows_the_cause_and_refusals_are_their_own_episode(
        caplog: pytest.LogCaptureFixture, watched: tuple[UpstreamEpisodes, Clock]) -> None:
    episodes, _clock = watched
    episodes.failed("mid_stream", "went silent", "timeout")
    episodes.answered(401)
    episodes.answered(403)
    found = lines(caplog)
    assert "--read-timeout" in found[0][1]
    assert [level for level, _ in found] == [logging.WARNING, logging.WARNING]
    assert "refused a request's credentials (401)" in found[1][1]
    # broken off (its exception is the connection's): the server answered, so no hint
    other = UpstreamEpisodes("http://up", clock=Clock())
    other.failed("mid_stream", "the connection broke", "connect")
    [(_, warned)] = lines(caplog)
    assert "--upstream" not in warned and "--read-timeout" not in warned
