"""The agents' configuration as the docs show it (docs/snippets/), with a live test's values.

The live Pi and OpenClaw tests start every provider they write from the snippet a reader
copies: its keys and its ``api`` come from the file, its URL keeps the file's path (only the
origin, and for OpenClaw the agent's name, are the test's), and only values a test must choose
(its key, its model and window) are its own. So a snippet that stops working for a real agent
fails a live test, and a key the docs add fails here until the live tests set it too.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from proxy.settings import DEFAULT_LISTEN

SNIPPETS = Path(__file__).resolve().parents[2] / "docs" / "snippets"
SHOWN_ORIGIN = f"http://{DEFAULT_LISTEN}"
PROVIDER_KEYS = frozenset({"baseUrl", "apiKey", "api", "models"})
# A model's keys a test may leave out: compat is the test's choice (the docs show the one
# a reader on the vendor's own host needs; the live tests run against a local upstream).
OPTIONAL_MODEL_KEYS = frozenset({"compat"})
AGENT_SEGMENT = re.compile(r"/agents/[^/]+/")


def shown(name: str) -> dict[str, Any]:
    value = json.loads((SNIPPETS / name).read_text())
    assert isinstance(value, dict), f"{name}: not a JSON object"
    return value


def providers_of(snippet: dict[str, Any]) -> dict[str, Any]:
    """Pi's models.json holds ``providers`` at the top, OpenClaw's config under ``models``."""
    holder = snippet.get("models", snippet)
    found = holder["providers"]
    assert isinstance(found, dict) and found
    return found


def provider_shown(name: str, api: str | None = None) -> dict[str, Any]:
    """The snippet's one provider (or its provider speaking ``api``), as a copy."""
    found = [p for p in providers_of(shown(name)).values() if api is None or p["api"] == api]
    assert len(found) == 1, f"{name}: {len(found)} providers for api {api}"
    return copy.deepcopy(found[0])


def url_at(shown_url: str, origin: str, agent: str | None = None) -> str:
    """``shown_url`` for a tailfloor at ``origin`` (and agent ``agent`` instead of the one
    shown): the path a reader copies is the path the live test sends to."""
    assert shown_url.startswith(SHOWN_ORIGIN), f"{shown_url}: not the default listener"
    path = shown_url[len(SHOWN_ORIGIN):]
    if agent is not None:
        assert AGENT_SEGMENT.search(path), f"{shown_url}: no agent prefix"
        path = AGENT_SEGMENT.sub(f"/agents/{agent}/", path, count=1)
    return origin.rstrip("/") + path


def provider(template: dict[str, Any], *, base_url: str, api_key: str,
             models: list[dict[str, Any]]) -> dict[str, Any]:
    """``template`` with a test's URL, key and models, every key of it kept."""
    unknown = set(template) - PROVIDER_KEYS
    assert not unknown, f"the docs' provider has keys the live tests do not set: {unknown}"
    needed = set(template["models"][0]) - OPTIONAL_MODEL_KEYS
    for model in models:
        missing = needed - set(model)
        assert not missing, f"the docs' model has keys the live tests do not set: {missing}"
    return {**template, "baseUrl": base_url, "apiKey": api_key, "models": models}
