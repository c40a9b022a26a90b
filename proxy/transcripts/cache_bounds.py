"""How the memory kept for reuse between an agent's requests is shared. Pure.

Three caches make a restore cheap on the next request of the same session: kept renderings
of tail messages (``render_cache.py``), the unpacked windows of recently served sessions
(``served.py``), and the token counts of the messages a request sends again
(``proxy/tokens.py``). When the sessions at work need more than they may hold, every request
reads, decodes, renders and counts its messages again: with a thousand agents at work and
the bounds a single agent needs, CPU per request nearly doubled and the added time to first
chunk went from tens of milliseconds to seconds (docs/benchmarks.md, "A thousand agents").
One figure, ``--session-cache-bytes``, sets them all, from the costs
tests/bench/session_memory.py measures."""

from __future__ import annotations

from proxy.transcripts.render_cache import ROW
from proxy.values import frozen_value

__all__ = ["DEFAULT_CACHE_BYTES", "CacheBounds", "cache_bounds"]

DEFAULT_CACHE_BYTES = 28 * 1024 * 1024  # the bounds one agent's sessions need, with room
_RENDERED_SHARE = 0.6
_BYTES_PER_ENTRY = 300  # an unpacked window's entry object
_ENTRIES_PER_SESSION = 32  # a served session's window, on average, to bound their number
_TOKEN_COUNTS = 65_536


@frozen_value
class CacheBounds:
    rendered_bytes: int  # memory the kept renderings hold (render_cache.py counts it)
    rendered_entries: int
    decoded_bytes: int  # memory the renderings held decoded hold, as render_cache.py reckons
    served_sessions: int
    served_entries: int
    token_counts: int  # messages whose token counts are remembered (proxy/tokens.py)


def cache_bounds(memory: int) -> CacheBounds:
    """The caches' bounds for ``memory`` bytes in all (each at least a little)."""
    rendered_memory = int(memory * _RENDERED_SHARE)
    # A sixth of it for the renderings of long tails held decoded (render_cache.py).
    decoded_bytes = rendered_memory // 6
    rendered_bytes = max(64 * 1024, rendered_memory - decoded_bytes)
    served_entries = max(1024, (memory - rendered_memory) // _BYTES_PER_ENTRY)
    return CacheBounds(
        rendered_bytes=rendered_bytes,
        # each holds ``ROW`` bytes at least, so the bytes bound them before this does
        rendered_entries=max(256, rendered_bytes // ROW),
        decoded_bytes=max(16 * 1024, decoded_bytes),
        served_sessions=max(32, served_entries // _ENTRIES_PER_SESSION),
        served_entries=served_entries,
        # An agent's next request counts the same messages again: ~115 bytes a count kept
        # (its key and the map's slot), one per 1.5 KB of the figure (7.5% more memory than
        # it), and never fewer than one agent's sessions need (7.5 MB).
        token_counts=max(_TOKEN_COUNTS, memory // 1536))
