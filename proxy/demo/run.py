"""The demo's run: the local model server, a recording relay, ``tailfloor serve`` in front of
it (subprocesses on free loopback ports, a temporary sessions directory), then three steps,
each printed with its ``x-tailfloor`` verdict and the messages the model received:

1. an overflow: the server's own refusal, the summary the model writes, the retry;
2. Pi compacted its session: the floor puts raw messages back after Pi's summary;
3. Pi starts a new session: the floor carries the last session's tail into it;

then the counts from ``/metrics`` on the admin listener.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from proxy.demo.processes import Process, free_port, http, metrics
from proxy.demo.relay import Received, Relay
from proxy.demo.script import (
    MODEL,
    SYSTEM,
    PiSession,
    overflow_conversation,
    pi_messages,
    turns,
)

__all__ = ["N_CTX", "run_demo"]

N_CTX = 1536  # small: little for the model to read; room for one summarizer call
SESSION_A = "01a2d3e4-0000-7000-8000-00000000000a"
SESSION_B = "01a2d3e5-0000-7000-8000-00000000000b"
SUMMARY = ("## Goal\nFix the flaky nightly export.\n\n## Progress\n- config and lock timeout "
           "read\n\n## Next Steps\n- look at the report step")
# The floor asks for 4 raw messages after a summary; a small reserve, so a 1536-token window
# holds them; short summaries, so the small model is quick.
RULES = """[defaults]
min_tail_messages = 4
reserve_tokens = 64
summary_max_tokens = 32
summarizer_timeout = 120
"""
METRICS = [("tailfloor_overflow_total", {"outcome": "recovered"}),
           ("tailfloor_compactions_total", {"trigger": "overflow"}),
           ("tailfloor_summarizer_tokens_total", {"type": "output"}),
           ("tailfloor_rewrites_total", {"kind": "floor"}),
           ("tailfloor_rewrites_total", {"kind": "carry"}),
           ("tailfloor_tail_messages_injected_total", {})]
STEPS = 3


@dataclass
class Step:
    verdict: str
    received: list[Received]


class Demo:
    def __init__(self, work: Path, out: TextIO, stay: bool = False) -> None:
        self.work = work
        self.out = out
        self.stay = stay
        self.sessions = work / "sessions"
        self.project = self.sessions / "--home-dev-export--"
        self.started = time.monotonic()

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def run(self) -> int:
        self.say(f"tailfloor demo: working in {self.work}")
        self.say("starting the local model (llama.cpp, SmolLM2-135M, "
                 f"n_ctx {N_CTX}) ...")
        model_port = free_port()
        model = Process([sys.executable, "-m", "proxy.localmodel", "--port", str(model_port),
                         "--n-ctx", str(N_CTX)], self.work / "model.log")
        relay = None
        proxy = None
        try:
            model.wait_ready(f"http://127.0.0.1:{model_port}/health", seconds=90)
            relay = Relay(model_port)
            self._write_session_a()
            rules = self.work / "rules"
            rules.mkdir()
            (rules / "00-demo.toml").write_text(RULES)
            port, admin = free_port(), free_port()
            self.say(f"starting tailfloor on 127.0.0.1:{port} (admin 127.0.0.1:{admin}) ...")
            proxy = Process([sys.executable, "-m", "proxy", "serve", "--listen",
                             f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
                             "--upstream", f"http://127.0.0.1:{relay.port}",
                             "--sessions", str(self.sessions), "--rules", str(rules),
                             "--state", str(self.work / "state"), "--log-format", "json",
                             "--inspect-content"],
                            self.work / "tailfloor.log")
            proxy.wait_ready(f"http://127.0.0.1:{port}/readyz", seconds=30)
            chat = f"http://127.0.0.1:{port}/v1/chat/completions"
            steps: list[tuple[str, str, Callable[[], Step]]] = [
                ("an overflow recovered", "compacted:overflow",
                 lambda: self._post(chat, relay, overflow_conversation())),
                ("a compaction followed by the floor", "floor; restored=",
                 lambda: self._post(chat, relay, self._after_compaction())),
                ("a reset followed by the carry", "carry; carried=",
                 lambda: self._post(chat, relay, self._new_session()))]
            failed = 0
            for number, (title, expected, act) in enumerate(steps, 1):
                self.say(f"\n[step {number}/{STEPS}] {title} "
                         f"({time.monotonic() - self.started:.0f} s)")
                step = act()
                self._show(step)
                if not step.verdict.startswith(expected):
                    failed += 1
                    self.say(f"  unexpected: x-tailfloor should start with {expected!r}")
            self._show_metrics(f"http://127.0.0.1:{admin}/metrics")
            took = time.monotonic() - self.started
            self.say(f"\ndemo {'finished' if not failed else 'FAILED'} in {took:.0f} s "
                     f"(logs in {self.work})")
            self.say(f"what the model saw, message by message: "
                     f"http://127.0.0.1:{admin}/tailfloor/ui")
            if self.stay:
                self._stay_up()
            return 1 if failed else 0
        finally:
            for process in (proxy, model):
                if process is not None:
                    process.stop()
            if relay is not None:
                relay.stop()

    def _stay_up(self) -> None:
        self.say("tailfloor stays up until Ctrl-C")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            self.say()

    # ------------------------------------------------------------------ the steps
    def _post(self, url: str, relay: Relay, messages: list[dict[str, Any]]) -> Step:
        relay.take()
        body = {"model": MODEL, "messages": messages, "max_tokens": 16}
        self.say(f"  the client sends {len(messages)} messages")
        status, headers, answer = http(url, json.dumps(body).encode())
        verdict = headers.get("x-tailfloor", "(none)")
        self.say(f"  HTTP {status}; x-tailfloor: {verdict}")
        for name, value in sorted(headers.items()):
            if name.startswith("x-tailfloor") and name != "x-tailfloor":
                self.say(f"  {name}: {value}")
        if status == 200:
            reply = json.loads(answer)["choices"][0]["message"]["content"] or ""
            self.say(f"  the model answered: {_line(reply)}")
        else:
            self.say(f"  error: {_line(answer.decode(errors='replace'))}")
        return Step(verdict, relay.take())

    def _show(self, step: Step) -> None:
        self.say(f"  the model received {len(step.received)} request(s):")
        for i, got in enumerate(step.received, 1):
            body = got.json() or {}
            messages = body.get("messages") or []
            first = messages[0].get("content") if messages else ""
            kind = ("summarizer call" if isinstance(first, str)
                    and "summarization assistant" in first else "chat request")
            self.say(f"   #{i} {kind}, {len(messages)} messages -> HTTP {got.status}")
            refusal = got.error_message()
            if refusal:
                self.say(f"      the server refused: {_line(refusal, 140)}")
                continue
            for message in messages:
                self.say(f"      {message.get('role', '?'):<9} {_line(_text(message))}")

    def _show_metrics(self, url: str) -> None:
        self.say("\ncounts from /metrics (admin listener):")
        samples = metrics(url)
        for name, labels in METRICS:
            value = sum(v for (n, got), v in samples.items() if n == name
                        and all(dict(got).get(k) == w for k, w in labels.items()))
            shown = ",".join(f'{k}="{w}"' for k, w in labels.items())
            self.say(f"  {name}{{{shown}}} {value:g}")

    # ---------------------------------------------------------------- the session
    def _write_session_a(self) -> None:
        """Pi's session: eight turns, then Pi's own compaction keeping the last one."""
        self.session_a = PiSession(SESSION_A, self.project / f"2026-12-01T09-00-00-000Z_"
                                   f"{SESSION_A}.jsonl")
        ids = []
        for user, reply in turns(8):
            ids.append(self.session_a.user(user))
            self.session_a.assistant(reply)
        self.session_a.compaction(SUMMARY, ids[7])

    def _after_compaction(self) -> list[dict[str, Any]]:
        question = "What should I look at first?"
        self.say("  Pi compacted its session: it sends its summary, the last turn and a "
                 "question")
        self.session_a.user(question)
        return pi_messages(SUMMARY, turns(8)[7:], question)

    def _new_session(self) -> list[dict[str, Any]]:
        hello = "Hello again: where were we?"
        self.say("  Pi starts a new session (/new): it sends its system prompt and one "
                 "message")
        session = PiSession(SESSION_B, self.project / f"2026-12-01T10-00-00-000Z_"
                            f"{SESSION_B}.jsonl")
        session.user(hello)
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": hello}]


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _line(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[:width] + "..."


def run_demo(work: Path, out: TextIO = sys.stdout, stay: bool = False) -> int:
    """``stay``: keep tailfloor and the model up after the steps, until Ctrl-C."""
    return Demo(work, out, stay).run()
