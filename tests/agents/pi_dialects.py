"""The real Pi agent on the other two APIs: ``openai-responses`` and ``anthropic-messages``.

``dialect_agent`` makes a ``PiAgent`` (its home, sessions, settings) whose only provider speaks
the given API to ``upstream`` (the fake upstream, or tailfloor in front of it); ``PiRpc`` then
drives it as for chat completions, and ``compact``/``run_turns`` add what the live tests need.

The base URL differs by API, because the SDKs append different paths: Pi's OpenAI SDK posts to
``{baseUrl}/responses`` (so ``{upstream}/v1``), its Anthropic SDK to ``{baseUrl}/v1/messages``
(so ``{upstream}`` itself). ``requests_of`` picks a dialect's requests from the fake's record.

Example (through tailfloor)::

    agent = dialect_agent(tmp_path, proxy.url, ANTHROPIC, version=PI_LATEST)
    rpc = PiRpc(agent)
    try:
        run_turns(rpc, ["Hello", "USE_TOOL:read the readme"])
        compact(rpc)                  # Pi's own compaction (RPC ``compact``)
        rpc.prompt("after the compaction")
        rpc.new_session()
        rpc.prompt("a new session")   # the carry
    finally:
        rpc.close()
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.agents.pi_agent import PI_VERSION, PiAgent, release
from tests.agents.pi_rpc import PiRpc
from tests.agents.snippets import provider, provider_shown

RESPONSES = "openai-responses"
ANTHROPIC = "anthropic-messages"
APIS = (RESPONSES, ANTHROPIC)
PROVIDER = "fakeup"
MODEL = "fake-model"
# A key shaped like each vendor's (an Anthropic key must not look like an OAuth token,
# ``sk-ant-oat...``, or Pi switches to Claude Code's identity and headers).
KEYS = {RESPONSES: "sk-fake-local-responses", ANTHROPIC: "sk-ant-api03-fake-local"}
PATHS = {RESPONSES: "/responses", ANTHROPIC: "/messages"}


def base_url(api: str, upstream: str) -> str:
    """The ``baseUrl`` that makes Pi's SDK for ``api`` post to ``upstream``'s route."""
    upstream = upstream.rstrip("/")
    if api == RESPONSES:
        return upstream if upstream.endswith("/v1") else upstream + "/v1"
    if api == ANTHROPIC:
        return upstream.removesuffix("/v1")
    raise ValueError(f"not a dialect API: {api}")


def models_json(api: str, upstream: str, *, context_window: int = 6000,
                max_tokens: int = 1024, reasoning: bool = False,
                compat: dict[str, Any] | None = None, **model_extra: Any) -> dict[str, Any]:
    """A models.json with one provider speaking ``api`` to ``upstream``."""
    model: dict[str, Any] = {
        "id": MODEL, "name": "Fake Model", "reasoning": reasoning, "input": ["text"],
        "contextWindow": context_window, "maxTokens": max_tokens,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}, **model_extra}
    if compat:
        model["compat"] = compat
    shown = provider_shown("pi-models-dialects.json", api)  # docs/dialects.md's provider
    return {"providers": {PROVIDER: provider(shown, base_url=base_url(api, upstream),
                                             api_key=KEYS[api], models=[model])}}


def write_models(agent_dir: Path, api: str, upstream: str, **options: Any) -> Path:
    path = agent_dir / "models.json"
    path.write_text(json.dumps(models_json(api, upstream, **options), indent=2))
    return path


def dialect_agent(home: Path, upstream: str, api: str, *, version: str = PI_VERSION,
                  context_window: int = 6000, max_tokens: int = 1024,
                  reserve_tokens: int = 1500, keep_recent_tokens: int = 1200,
                  reasoning: bool = False, compat: dict[str, Any] | None = None,
                  settings: dict[str, object] | None = None) -> PiAgent:
    """A Pi home whose default model speaks ``api``; thinking is off unless ``reasoning``."""
    agent = PiAgent(home, upstream, context_window=context_window, max_tokens=max_tokens,
                    reserve_tokens=reserve_tokens, keep_recent_tokens=keep_recent_tokens,
                    pi=release(version),
                    settings={"defaultThinkingLevel": "low" if reasoning else "off",
                              **(settings or {})})
    write_models(agent.agent_dir, api, upstream, context_window=context_window,
                 max_tokens=max_tokens, reasoning=reasoning, compat=compat)
    return agent


def compact(rpc: PiRpc, instructions: str | None = None, timeout: float = 60) -> dict[str, Any]:
    """Pi's manual compaction (what ``/compact`` does): its answer, with the summary."""
    command: dict[str, Any] = {"type": "compact"}
    if instructions:
        command["customInstructions"] = instructions
    answer = rpc.wait("response", timeout=timeout, ident=rpc.send(command))
    if not answer.get("success", True):
        raise RuntimeError(f"pi could not compact: {answer}")
    return answer


def run_turns(rpc: PiRpc, prompts: list[str]) -> list[bool]:
    """Each prompt to its end; for each, whether Pi compacted during or right after it."""
    return [rpc.prompt(prompt) for prompt in prompts]


def requests_of(fake: Any, api: str) -> list[Any]:
    """The fake's ``Received`` requests of ``api`` (its path ends in /responses or /messages)."""
    return [r for r in fake.received if r.path.endswith(PATHS[api])]


def last_assistant_text(agent: PiAgent) -> str:
    """The text of the newest assistant message in the newest session file."""
    for entry in reversed(agent.entries()):
        message = entry.get("message")
        if isinstance(message, dict) and message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(str(block.get("text", "")) for block in content
                               if isinstance(block, dict) and block.get("type") == "text")
    return ""
