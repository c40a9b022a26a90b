"""The first scan read by worker processes builds the catalog one process builds.

The oracle is the scan without workers (``scan_workers="0"``, the code every change of a
transcript goes through): over the recorded captures plus hostile files (torn, malformed,
not UTF-8, headerless, an unknown version, version 1, empty, a name with a newline, a
transcript over 64 KiB read from its end, two files of one session), both scans must give
the same sessions, the same problems in the same order, the same lines counted, the same
tails read back from the files and the same content-index answers. Then what a worker read
must be followed as the tracker's own reads are, and a worker that dies, or never starts,
must cost no file.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.cli.main import build_parser
from proxy.settings import Settings, SettingsError, from_namespace
from proxy.transcripts import scan_pool
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.cpus import usable_cpus
from proxy.transcripts.entries import EntryError, parse_entry
from proxy.transcripts.tracker import Tracker
from tests.transcripts.conftest import CAPTURES

HEADER = {"type": "session", "version": 3, "timestamp": "2026-11-30T03:00:00Z", "cwd": "/w"}


def _line(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj) + b"\n"


def _user(entry_id: str, parent: str | None, text: str) -> dict[str, Any]:
    return {"type": "message", "id": entry_id, "parentId": parent,
            "timestamp": "2026-11-30T03:00:01Z",
            "message": {"role": "user", "content": text, "timestamp": 1796007601000}}


def _pi(folder: Path, sid: str, body: bytes, name: str | None = None) -> Path:
    path = folder / (name or f"2026-11-30T03-00-00-000Z_{sid}.jsonl")
    path.write_bytes(_line({**HEADER, "id": sid}) + body)
    return path


def _hostile(folder: Path) -> None:
    folder.mkdir(parents=True)
    _pi(folder, "torn", _line(_user("e1", None, "first")) + b'{"type": "message", "id": "e2", '
        b'broken\n' + b'{"type":"message","id":"e3","parentId":"e1","message":{"role":"user",'
        b'"content":"\xff\xfe"}}\n' + _line(_user("e4", "e1", "fourth")) + b'{"type": "mess')
    (folder / "2026-11-30T03-00-00-000Z_nohead.jsonl").write_bytes(_line(_user("x", None, "x")))
    (folder / "2026-11-30T03-00-00-000Z_future.jsonl").write_bytes(
        _line({**HEADER, "id": "future", "version": 99}))
    (folder / "2026-11-30T03-00-00-000Z_empty.jsonl").write_bytes(b"")
    _pi(folder, "v1", b"".join(_line({"type": "message", "timestamp": "2026-11-30T03:00:01Z",
                                      "message": {"role": "user", "content": f"v1 turn {i}"}})
                               for i in range(5)))
    _pi(folder, "newline", _line(_user("n1", None, "a name with a newline")),
        name="2026-11-30T03-00-00-000Z_new\nline.jsonl")
    big = [_line(_user("b0", None, "the oldest turn")),
           _line({"type": "compaction", "id": "c1", "parentId": "b0",
                  "timestamp": "2026-11-30T03:00:02Z", "summary": "what came before",
                  "firstKeptEntryId": "b0"})]
    big += [_line(_user(f"b{i}", f"b{i - 1}" if i > 1 else "c1", f"turn {i} " + "y" * 900))
            for i in range(1, 120)]
    _pi(folder, "big", b"".join(big))
    _pi(folder, "twice", _line(_user("t1", None, "in the first file")),
        name="2026-11-30T03-00-00-000Z_twice-a.jsonl")
    _pi(folder, "twice", _line(_user("t1", None, "in the second file")),
        name="2026-11-30T03-00-00-000Z_twice-b.jsonl")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    top = tmp_path / "root"
    shutil.copytree(CAPTURES, top)
    _hostile(top / "hostile" / "--w--")
    return top


def _scan(root: Path, workers: str) -> tuple[Catalog, Tracker, list[tuple[str, str, str]]]:
    problems: list[tuple[str, str, str]] = []
    catalog = Catalog(20)  # a small tail: the big transcript's window is trimmed
    tracker = Tracker([root], catalog, lambda *p: problems.append(p), scan_workers=workers)
    tracker.scan()
    return catalog, tracker, problems


def _keys(root: Path) -> set[int]:
    """Every content-index key the JSONL files hold, parsed here line by line."""
    keys: set[int] = set()
    for path in root.rglob("*.jsonl*"):
        for line in path.read_bytes().splitlines():
            try:
                keys.update(parse_entry(orjson.loads(line), 0).keys)
            except (orjson.JSONDecodeError, EntryError):
                continue
    return keys


def _same(one: tuple[Catalog, Tracker, list[tuple[str, str, str]]],
          other: tuple[Catalog, Tracker, list[tuple[str, str, str]]], root: Path) -> None:
    (a, tracker_a, problems_a), (b, tracker_b, problems_b) = one, other
    records = sorted(a.sessions(), key=lambda r: r.info.session_id)
    assert records == sorted(b.sessions(), key=lambda r: r.info.session_id)
    assert problems_a == problems_b
    assert tracker_a.lines == tracker_b.lines
    for record in records:
        sid = record.info.session_id
        assert a.tail(sid, 50) == b.tail(sid, 50), sid
        assert a.full(sid) == b.full(sid), sid
    keys = _keys(root)
    assert keys
    assert [a.find_key(k) for k in keys] == [b.find_key(k) for k in keys]


def test_workers_build_the_catalog_one_process_builds(root: Path) -> None:
    alone = _scan(root, "0")
    catalog = alone[0]
    assert len(catalog) >= 20
    assert {"torn", "v1", "newline", "big", "twice"} <= {r.info.session_id
                                                          for r in catalog.sessions()}
    kinds = {kind for kind, _where, _detail in alone[2]}
    assert {"malformed_json", "invalid_utf8", "missing_header", "bad_version"} <= kinds
    assert "scan_worker" not in kinds
    big = catalog.get("big")
    assert big is not None and not big.count_complete  # read from its end
    _same(alone, _scan(root, "2"), root)


def test_a_transcript_a_worker_read_is_followed(root: Path) -> None:
    catalog, tracker, _problems = _scan(root, "2")
    folder = root / "hostile" / "--w--"
    torn = folder / "2026-11-30T03-00-00-000Z_torn.jsonl"
    with torn.open("ab") as f:  # the torn line completed, then one more turn
        f.write(b'age", "id": "e5", "parentId": "e4", "message": {"role": "user", '
                b'"content": "fifth"}}\n' + _line(_user("e6", "e5", "sixth")))
    assert tracker.changed([torn]) == {"torn"}
    texts = [m.messages[0]["content"] for m in catalog.tail("torn", 10)]
    assert texts[-3:] == ["fourth", "fifth", "sixth"]
    # the same file written again in place, another session in it, as long as before
    newline = folder / "2026-11-30T03-00-00-000Z_new\nline.jsonl"
    size = newline.stat().st_size
    text = _line({**HEADER, "id": "other"}) + _line(_user("o1", None, "another session"))
    with newline.open("r+b") as f:
        f.write(text.ljust(size, b" ") if len(text) < size else text)
    assert tracker.changed([newline]) == {"newline", "other"}
    assert "newline" not in catalog and "other" in catalog


# A worker that answers its first block, then sends half a frame and ends.
_DIES = """
import sys
from proxy.transcripts.scan_worker import read_block, read_frame, write_frame
startup, whole_below, limit, count = read_frame(sys.stdin.buffer)
block = read_frame(sys.stdin.buffer)
write_frame(sys.stdout.buffer, read_block(block, startup, whole_below, limit))
sys.stdout.buffer.write(b"\\x40\\x00\\x00\\x00\\x00\\x00\\x00\\x00cut")
sys.exit(1)
"""


# A worker that answers a block of the right length, every item of the wrong shape.
_MISSHAPEN = """
import sys
from proxy.transcripts.scan_worker import read_frame, write_frame
startup, whole_below, limit, count = read_frame(sys.stdin.buffer)
for _ in range(count):
    block = read_frame(sys.stdin.buffer)
    write_frame(sys.stdout.buffer, [("not", "a", ["read"])] * len(block))
"""


@pytest.mark.parametrize("worker", [("-c", _DIES), ("-c", "import sys; sys.exit(3)"),
                                    ("-c", "print('not a frame')"), ("-c", _MISSHAPEN),
                                    ("-c", "import time; time.sleep(30)")],
                         ids=["dies-after-a-block", "exits-at-once", "answers-garbage",
                              "misshapen-reads", "hangs"])
def test_a_worker_that_fails_costs_no_file(root: Path, monkeypatch: pytest.MonkeyPatch,
                                           worker: tuple[str, str]) -> None:
    alone = _scan(root, "0")
    monkeypatch.setattr(scan_pool, "BLOCK", 4)  # many blocks: the failure comes mid-scan
    monkeypatch.setattr(scan_pool, "WORKER", worker)
    monkeypatch.setattr(scan_pool, "PATIENCE", 0.5)
    pooled = _scan(root, "2")
    failures = [p for p in pooled[2] if p[0] == "scan_worker"]
    # one report per worker that stopped answering; misshapen reads are read again quietly
    assert len(failures) == (0 if worker[1] == _MISSHAPEN else 2)
    _same(alone, (pooled[0], pooled[1], [p for p in pooled[2] if p[0] != "scan_worker"]),
          root)


def test_no_worker_when_none_can_start(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alone = _scan(root, "0")
    monkeypatch.setattr(sys, "executable", str(root / "no-such-python"))
    pooled = _scan(root, "1")
    assert [p[0] for p in pooled[2] if p[0] == "scan_worker"] == ["scan_worker"]
    _same(alone, (pooled[0], pooled[1], [p for p in pooled[2] if p[0] != "scan_worker"]),
          root)


@pytest.mark.parametrize(("files", "setting", "cpus", "workers"), [
    (50_000, "auto", 2.0, 2), (50_000, "auto", 16.0, scan_pool.MAX_WORKERS),
    (50_000, "auto", 1.5, 0), (scan_pool.POOL_FROM - 1, "auto", 8.0, 0),
    (10, "3", 1.0, 3), (0, "2", 8.0, 0), (10, "0", 8.0, 0)])
def test_how_many_workers(files: int, setting: str, cpus: float, workers: int) -> None:
    assert scan_pool.workers_for(files, setting, cpus) == workers


@pytest.mark.parametrize(("files", "member", "expected"), [
    ({"cpu.max": "50000 100000\n"}, "0::/\n", 0.5),
    ({"cpu.max": "max 100000\n"}, "0::/\n", None),
    ({"cpu.max": "garbage"}, "0::/\n", None),
    ({"cpu.max": "50000 0\n"}, "0::/\n", None),
    ({"a/cpu.max": "50000 100000\n", "a/b/cpu.max": "max 100000\n"}, "0::/a/b\n", 0.5),
    ({"a/cpu.max": "300000 100000\n", "a/b/cpu.max": "150000 100000\n"}, "0::/a/b\n",
     1.5),
    ({"cpu,cpuacct/pod/cpu.cfs_quota_us": "150000\n",
      "cpu,cpuacct/pod/cpu.cfs_period_us": "100000\n"}, "4:cpu,cpuacct:/pod\n", 1.5),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "", None)],
    ids=["v2-half", "v2-none", "v2-garbage", "v2-zero-period", "v2-parent-slice",
         "v2-tightest", "v1-one-and-a-half", "v1-none"])
def test_a_container_quota_caps_the_cpus(tmp_path: Path, files: dict[str, str], member: str,
                                         expected: float | None) -> None:
    cgroups = tmp_path / "cgroup"
    for name, text in files.items():
        (cgroups / name).parent.mkdir(parents=True, exist_ok=True)
        (cgroups / name).write_text(text)
    (tmp_path / "membership").write_text(member)
    affinity = usable_cpus(tmp_path / "absent", tmp_path / "absent")
    assert affinity >= 1
    assert usable_cpus(cgroups, tmp_path / "membership") == (
        affinity if expected is None else min(affinity, expected))


def test_a_worker_imports_nothing_from_the_working_directory(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A file named like a module the worker imports, where the server was started.
    trap = tmp_path / "cwd"
    trap.mkdir()
    (trap / "pickle.py").write_text("raise SystemExit(7)\n")
    (trap / "orjson.py").write_text("raise SystemExit(7)\n")
    alone = _scan(root, "0")
    monkeypatch.chdir(trap)
    _same(alone, _scan(root, "2"), root)  # no scan_worker problem among them


def _settings(argv: list[str], env: dict[str, str]) -> Settings:
    return from_namespace(build_parser().parse_args(["serve", *argv]), env)


def test_the_setting_takes_a_count_or_auto() -> None:
    assert _settings(["--scan-workers", "2"], {}).scan_workers == "2"
    assert _settings([], {"TAILFLOOR_SCAN_WORKERS": "0"}).scan_workers == "0"
    assert _settings([], {}).scan_workers == "auto"
    with pytest.raises(SettingsError):
        _settings([], {"TAILFLOOR_SCAN_WORKERS": "9"})


def test_a_worker_gets_none_of_the_servers_secrets(root: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker reads files and logs nothing, but it is a process of its own: the keys and
    # tokens in the server's environment (an upstream key, a cloud credential) stay there.
    seen = tmp_path / "seen"
    seen.mkdir()
    worker = ("-c", f"""
import os, sys, uuid
with open(os.path.join({str(seen)!r}, uuid.uuid4().hex), "w") as out:
    out.write("\\n".join(f"{{k}}={{v}}" for k, v in os.environ.items()))
from proxy.transcripts.scan_worker import main
sys.exit(main())
""")
    alone = _scan(root, "0")
    monkeypatch.setenv("TAILFLOOR_UPSTREAM_API_KEY", "sk-not-for-workers")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-workers-either")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setattr(scan_pool, "BLOCK", 4)
    monkeypatch.setattr(scan_pool, "WORKER", worker)
    pooled = _scan(root, "2")
    environments = [f.read_text() for f in seen.iterdir()]
    assert len(environments) == 2
    for text in environments:
        assert "not-for-workers" not in text
        assert "\nLC_ALL=C.UTF-8" in f"\n{text}" and "PYTHONPATH=" in text
    assert not [p for p in pooled[2] if p[0] == "scan_worker"]
    _same(alone, pooled, root)
