"""Memory per tracked session, per session served, per kept rendering and per stored
fingerprint, measured in process with tracemalloc (bytes Python allocated and still holds).

    python -m tests.bench.session_memory [--dirs 40] [--per-dir 100] [--served 100]
                                         [--prints 10000] [--top 12]

Writes ``dirs`` x ``per_dir`` Pi sessions as ``cold_start`` does (~19 KB, ~15 entries each,
read whole at start), then, each step measured on its own against the one before:

- ``tracked``: a ``Tracker`` scan of them into a ``Catalog``: bytes held per session, and
  the source lines that allocated them (``--top``), per session;
- ``served``: ``Catalog.edits`` of ``served`` sessions, which unpacks their windows as a
  request reading them does (the catalog keeps at most ``SERVED_SESSIONS`` so);
- ``rendered``: ``Catalog.tail`` of 8 messages for the same sessions: the renderings kept
  between requests (``RenderedTail``), per rendering and per byte it counts against its
  budget (~1 since it counts the memory a rendering holds; trees before counted its
  transcript line), and what that budget allows at most;
- ``fingerprints``: ``prints`` sessions recorded in ``Fingerprints`` (100 distinct request
  fingerprints, as agents sharing a prompt have), per session, and at its limit.

It runs against any tree with these classes (the parts a tree lacks are reported as such),
so a tree before a change is measured with the same script: ``git archive`` it elsewhere
and run this file from there.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.identity.prompt_prints import Fingerprints
from proxy.transcripts import catalog as catalog_module
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.tracker import Tracker
from tests.bench.cold_start import generate

PACKAGE = str(Path(__file__).resolve().parents[2])


def _held(step: Callable[[], object]) -> tuple[int, tracemalloc.Snapshot, tracemalloc.Snapshot]:
    gc.collect()
    before = tracemalloc.take_snapshot()
    start = tracemalloc.get_traced_memory()[0]
    step()
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - start, before, tracemalloc.take_snapshot()


def _top(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, per: int,
         top: int) -> list[dict[str, Any]]:
    out = []
    for stat in after.compare_to(before, "lineno")[:top]:
        frame = stat.traceback[0]
        where = frame.filename.removeprefix(PACKAGE + "/")
        out.append({"line": f"{where}:{frame.lineno}", "bytes": round(stat.size_diff / per),
                    "objects": round(stat.count_diff / per, 1)})
    return out


def measure(root: Path, served: int, prints: int, top: int) -> dict[str, Any]:
    catalog = Catalog()
    tracker = Tracker([root], catalog, lambda *_a: None)
    tracemalloc.start()
    try:
        held, before, after = _held(tracker.scan)
        n = len(catalog)
        out: dict[str, Any] = {"sessions": n, "tracked_bytes_per_session": round(held / n),
                               "tracked_top": _top(before, after, n, top)}
        ids = [r.session_id for r in catalog.sessions()][:served]
        held, _b, _a = _held(lambda: [catalog.edits(sid) for sid in ids])
        out["served_bytes_per_session"] = round(held / len(ids))
        out["served_limit_sessions"] = getattr(catalog_module, "SERVED_SESSIONS", None)
        out["served_limit_entries"] = getattr(catalog_module, "SERVED_ENTRIES", None)
        held, _b, _a = _held(lambda: [catalog.tail(sid, 8) for sid in ids])
        kept = catalog.rendered
        renderings = len(kept._kept)
        out["renderings"] = renderings
        out["rendered_bytes_per_rendering"] = round(held / renderings)
        out["rendered_bytes_per_budget_byte"] = round(held / kept.bytes, 2)
        out["rendered_budget_bytes"] = kept.max_bytes
        out["rendered_at_most_mb"] = round(held / kept.bytes * kept.max_bytes / 1e6, 1)
        fingerprints = Fingerprints()

        def record() -> None:
            for i in range(prints):
                fingerprints.record(f"session-{i:08d}-{i * 7919:012x}", f"{i % 100:024x}")

        held, _b, _a = _held(record)
        out["fingerprint_bytes_per_session"] = round(held / prints)
        out["fingerprint_limit_sessions"] = fingerprints._limit
        out["fingerprints_at_most_mb"] = round(held / prints * fingerprints._limit / 1e6, 1)
    finally:
        tracemalloc.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--dirs", type=int, default=40)
    parser.add_argument("--per-dir", type=int, default=100)
    parser.add_argument("--served", type=int, default=100)
    parser.add_argument("--prints", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tailfloor-memory-"))
    try:
        generate(work, args.dirs, args.per_dir)
        print(json.dumps(measure(work, args.served, args.prints, args.top), indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
