"""A tail that ends before an entry of a long transcript (the messages a compaction
summarized, up to its first kept one) served from memory after its first read: the catalog
keeps the window it read, as it does for a tail to the end. Before, every such tail of a
transcript the scan read only from its end read the whole file again (a restore on each of
a long session's requests). The oracle: the same tail of the file read whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.transcripts.catalog import Catalog
from proxy.transcripts.jsonl import JsonlTranscript
from proxy.transcripts.records import SessionInfo
from tests.floor.synthetic import Transcript, write_jsonl


def _catalog(path: Path, sid: str, startup: int | None) -> Catalog:
    store, window = JsonlTranscript.start(path, lambda *_: None, startup, whole_below=0)
    catalog = Catalog()
    catalog.put(SessionInfo(session_id=sid, source="pi", era="pi", location=str(path),
                            agent_id="pi", group=str(path.parent)), store, window)
    return catalog


def test_a_tail_before_a_kept_entry_reads_the_file_once(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    t = Transcript("before")
    for turn in range(400):
        t.user(f"turn {turn} " + "x" * 300)
        t.assistant(f"answer {turn} " + "y" * 300)
    kept = t.message_ids()[-5]
    t.compaction("## Goal\nthe summary", kept)
    t.user("after the compaction")
    path = write_jsonl(tmp_path, t)
    catalog = _catalog(path, t.session_id, 8)  # as a scan keeps a long transcript
    reads: list[int | None] = []
    real = JsonlTranscript.read_window

    def counted(self: JsonlTranscript, min_messages: int | None) -> Any:
        reads.append(min_messages)
        return real(self, min_messages)

    monkeypatch.setattr(JsonlTranscript, "read_window", counted)
    whole = _catalog(path, t.session_id, None).tail(t.session_id, 36, before=kept)
    reads.clear()
    for _request in range(3):
        got = catalog.tail(t.session_id, 36, before=kept)
        assert [m.entry_id for m in got] == [m.entry_id for m in whole]
        assert [m.messages for m in got] == [m.messages for m in whole]
    assert len(reads) == 1 and reads[0] is not None  # one read from the end, kept
