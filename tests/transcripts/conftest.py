"""Fixtures: writable copies of the recorded transcripts in a temporary state layout."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts" / "captures"
PI_FILE = "2026-11-30T02-21-46-070Z_01a22a42-1ed4-778c-a542-c559c46de9e7.jsonl"
OC7_LIVE = "fb627afb-3e64-41f1-8338-19d7854437a0"
OC7_OLD = "bf293310-d774-4c44-8f8d-8c01da5175da"
OC9_MAIN = "dc99badc-cc56-4bbc-911e-08925dee1509"
OC9_NEXT = "5d1615c5-7597-45d9-ad20-61f5f30b2e0b"


def octet_length(value: object) -> int | None:
    if value is None:
        return None
    return len(value.encode()) if isinstance(value, str) else len(bytes(value))  # type: ignore[arg-type]


def writable_db(path: Path) -> sqlite3.Connection:
    """A writer connection like the agent's (the schema needs octet_length, SQLite 3.43+)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.create_function("octet_length", 1, octet_length, deterministic=True)
    return conn


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    """Pi sessions, an OpenClaw 2026.7 state dir and an OpenClaw 2026.9 state dir."""
    pi = tmp_path / "pi" / "sessions"
    shutil.copytree(CAPTURES / "pi-02-rpc-main" / "sessions", pi)
    oc7 = tmp_path / "oc7"
    shutil.copytree(CAPTURES / "oc735-01-gateway" / "state", oc7)
    oc9 = tmp_path / "oc9"
    shutil.copytree(CAPTURES / "oc96-state", oc9)
    return {"pi": pi, "oc7": oc7, "oc9": oc9}


def snapshot(paths: list[Path]) -> dict[Path, bytes]:
    out: dict[Path, bytes] = {}
    for root in paths:
        for p in sorted(root.rglob("*")):
            if p.is_file() and not p.name.endswith(("-shm", "-wal")):
                out[p] = p.read_bytes()
    return out
