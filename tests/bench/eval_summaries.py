"""Summary quality on fixed tasks: tailfloor's own summarizer against a bare prompt.

    python tests/bench/eval_summaries.py --upstream http://127.0.0.1:18090 --model smollm2 \\
        [--runs 3] [--window 2048] [--max-tokens 256] [--tail 4] [--api-key KEY] [--json]

Each task of ``summary_tasks.py`` (a checklist revised over many turns, a coding session with
tool calls, a multi-day assistant thread) is summarized ``--runs`` times through tailfloor's
summarizer (the prompt, chunking and update path overflow recovery uses, over the proxy's own
upstream client) and, in the same run, with a bare "Summarize this conversation." request.
Every summary is scored on the facts that must survive it; the report gives per-fact survival
over the runs and the mean score per task and prompt. Any OpenAI-compatible upstream works.

The "pins" column: tailfloor's summarizer also summarizes each task up to its last ``--tail``
messages, as a compaction would, and the bench counts the facts whose own words reach the
model verbatim (summary, pins, raw tail), without pins and with the user's pins
(tests/bench/pin_column.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from multidict import CIMultiDict

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from proxy.recovery.summarize.prompt import prompt_overhead
from proxy.recovery.summarize.response import parse_summary_response
from proxy.recovery.summarize.summarizer import Summarizer, SummarizerConfig
from proxy.recovery.summarize.transport import CHAT_PATH, UpstreamSummaryTransport
from proxy.tokens import TokenCounter, with_margin
from proxy.upstream.pool import Upstream
from tests.bench.pin_column import PinColumn, column, split
from tests.bench.summary_tasks import TASKS, Task, TaskScore, score

BARE_PROMPT = "Summarize this conversation."
PROMPTS = ("tailfloor", "bare")


@dataclass(frozen=True, slots=True)
class Run:
    task: str
    prompt: str  # tailfloor | bare
    summary: str
    scored: TaskScore
    pins: PinColumn | None = None  # the compaction's summary (prompt "pins")


async def bare_summary(upstream: Upstream, task: Task, model: str, max_tokens: int,
                       headers: dict[str, str]) -> str:
    """The whole conversation, then one user turn asking for a summary."""
    body = {"model": model, "stream": False, "max_tokens": max_tokens,
            "messages": [*task.messages, {"role": "user", "content": BARE_PROMPT}]}
    response = await upstream.send("POST", CHAT_PATH, "", CIMultiDict(headers),
                                   orjson.dumps(body))
    answer = await response.read()
    if response.status != 200:
        raise RuntimeError(f"bare prompt: HTTP {response.status}: {answer[:200]!r}")
    return parse_summary_response(answer).text


async def evaluate(url: str, model: str, *, runs: int, window: int, max_tokens: int,
                   api_key: str | None, margin: float = 0.2, tail: int = 4) -> list[Run]:
    upstream = Upstream(url, 10.0, 600.0)
    await upstream.start()
    tokens = TokenCounter()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    def count(message: dict[str, Any]) -> int:
        return with_margin(tokens.message(message, "o200k_base"), margin)

    # as overflow recovery configures it (proxy/recovery/summarize/service.py)
    config = SummarizerConfig(context_window=window, max_output_tokens=max_tokens,
                              timeout=900.0, call_timeout=600.0,
                              prompt_overhead_tokens=prompt_overhead(count),
                              token_field="max_tokens")
    summarizer = Summarizer(UpstreamSummaryTransport(upstream), config, count)
    results: list[Run] = []
    try:
        for _ in range(runs):
            for task in TASKS:
                conversation = [m for m in task.messages if m["role"] != "system"]
                made = await summarizer.summarize(conversation, model=model, headers=headers)
                results.append(Run(task.name, "tailfloor", made.text, score(task, made.text)))
                bare = await bare_summary(upstream, task, model, max_tokens, headers)
                results.append(Run(task.name, "bare", bare, score(task, bare)))
                head, _raw = split(task.messages, tail)
                compacted = await summarizer.summarize(head, model=model, headers=headers)
                results.append(Run(task.name, "pins", compacted.text,
                                   score(task, compacted.text),
                                   column(task, compacted.text, tail)))
    finally:
        await upstream.close()
    return results


def report(results: Sequence[Run]) -> dict[str, Any]:
    """Per task and prompt: the mean score and each fact's survival rate over the runs."""
    out: dict[str, Any] = {}
    for task in TASKS:
        for prompt in PROMPTS:
            mine = [r for r in results if r.task == task.name and r.prompt == prompt]
            if not mine:
                continue
            facts = {f.name: sum(next(x.survived for x in r.scored.facts if x.name == f.name)
                                 for r in mine) / len(mine) for f in task.facts}
            out.setdefault(task.name, {})[prompt] = {
                "score": round(sum(r.scored.score for r in mine) / len(mine), 1),
                "runs": len(mine), "facts": facts}
        columns = [r.pins for r in results if r.task == task.name and r.pins is not None]
        if columns:
            out.setdefault(task.name, {})["pins"] = _pin_row(task, columns)
    return out


def _pin_row(task: Task, columns: Sequence[PinColumn]) -> dict[str, Any]:
    """The pins column over the runs: mean shares, and each fact's rate of being lost."""
    def lost(rows: Sequence[tuple[str, ...]]) -> dict[str, float]:
        return {f.name: sum(f.name in r for r in rows) / len(rows) for f in task.facts
                if any(f.name in r for r in rows)}
    return {"without": round(sum(c.without for c in columns) / len(columns), 1),
            "with": round(sum(c.with_pins for c in columns) / len(columns), 1),
            "pinned": columns[0].pinned, "runs": len(columns),
            "lost_without": lost([c.lost_without for c in columns]),
            "lost_with": lost([c.lost_with for c in columns])}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="OpenAI-compatible base URL")
    parser.add_argument("--model", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--window", type=int, default=2048,
                        help="the model's context window (chunks are sized for it)")
    parser.add_argument("--max-tokens", type=int, default=256, help="summary length bound")
    parser.add_argument("--tail", type=int, default=4,
                        help="raw messages the compaction of the pins column keeps")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    results = asyncio.run(evaluate(args.upstream.rstrip("/"), args.model, runs=args.runs,
                                   window=args.window, max_tokens=args.max_tokens,
                                   api_key=args.api_key, tail=args.tail))
    summary = report(results)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for task, prompts in summary.items():
            for prompt, row in prompts.items():
                if prompt == "pins":
                    print(f"{task:10} pins      without {row['without']:5.1f}% with "
                          f"{row['with']:5.1f}% ({row['pinned']} pinned, tail {args.tail}); "
                          f"lost with pins: {', '.join(row['lost_with']) or '-'}")
                    continue
                lost = [name for name, rate in row["facts"].items() if rate < 1.0]
                print(f"{task:10} {prompt:9} score {row['score']:5.1f}% over {row['runs']} "
                      f"runs; not always kept: {', '.join(lost) or '-'}")
    return summary


if __name__ == "__main__":
    main()
