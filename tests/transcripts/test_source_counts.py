"""The per-source session counts (the ``tailfloor_sessions`` gauge) follow every change to the
catalog: kept as sessions come and go, they must match a recount of what it holds."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from proxy.transcripts.catalog import Catalog
from proxy.transcripts.records import SessionInfo, Window
from tests.transcripts.test_views import MemStore, conversation

_SOURCES = ("pi", "openclaw-jsonl", "openclaw-sqlite")
_OPS = st.lists(st.tuples(st.sampled_from(("put", "update", "remove")),
                          st.sampled_from("abcde"), st.sampled_from(_SOURCES)), max_size=40)


@given(_OPS)
def test_counts_match_a_recount_after_any_sequence_of_changes(
        ops: list[tuple[str, str, str]]) -> None:
    catalog = Catalog()
    for op, sid, source in ops:
        if op == "put":
            store = MemStore(conversation(1))
            catalog.put(SessionInfo(sid, source, "pi", "mem"), store,  # type: ignore[arg-type]
                        Window(store.entries(), True))
        elif op == "update":
            info = catalog.info(sid)
            if info is not None:
                catalog.update_info(replace(info, source=source))  # type: ignore[arg-type]
        else:
            catalog.remove(sid)
        recount = Counter(record.info.source for record in catalog.sessions())
        assert catalog.count_by_source() == dict(recount)
