"""What each bounded cache holds beside its bound, for ``tailfloor_cache_held`` and
``tailfloor_cache_bound``: read when scraped, so the figures cost the request path nothing.

A process's RSS grows while its caches fill toward their bounds, then should stop; beside
RSS these say whether a rise is a cache still filling (docs/deployment.md, "Memory")."""

from __future__ import annotations

from proxy.inspector.store import InspectorStore
from proxy.metrics import CacheFill
from proxy.tokens import TokenCounter
from proxy.transcripts.catalog import Catalog

__all__ = ["cache_fills"]


def cache_fills(catalog: Catalog, tokens: TokenCounter,
                inspector: InspectorStore | None) -> dict[str, CacheFill]:
    rendered, served = catalog.rendered, catalog.served
    fills: dict[str, CacheFill] = {
        "rendered_bytes": (lambda: rendered.bytes, rendered.max_bytes),
        "rendered": (rendered.__len__, rendered.max_entries),
        "rendered_decoded_bytes": (lambda: rendered.decoded_bytes, rendered.max_decoded_bytes),
        "served_sessions": (served.__len__, served.max_sessions),
        "served_entries": (lambda: served.entries, served.max_entries),
        "token_counts": (tokens.__len__, tokens.bound),
    }
    if inspector is not None:
        fills["inspector_bytes"] = (lambda: inspector.held, inspector.budget)
    return fills
