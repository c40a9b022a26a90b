"""Agent keys: the secret an ``[[agents]]`` entry names in ``key_file``, which requests
through that agent's ``/agents/<id>/`` prefix must carry in ``x-tailfloor-agent-key``.

A request of a keyed agent without its key, or with a wrong one, still goes to the upstream
untouched (never an error for the agent) but is given nothing of any session: no floor, no
carry, no restore, no compaction of its own (``tailfloor_identification_total{method=
"unauthenticated"}``). Keys are compared in constant time; the files are read off the event
loop (``refresh``, at start and every few seconds, again when a file changes), never logged.
A key file that cannot be read leaves its agent unauthenticated until it can (fail closed).
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from proxy.policy.records import RuleSet

__all__ = ["AgentKeys", "KeyVerdict"]

log = logging.getLogger("tailfloor.keys")
KeyVerdict = Literal["open", "ok", "missing", "wrong"]
_MAX_KEY_BYTES = 4096


@dataclass(frozen=True, slots=True)
class _Loaded:
    path: str
    stamp: tuple[int, int, int]  # the file's (mtime_ns, size, inode) when it was read
    key: bytes | None  # None: the file could not be read (the agent is refused)


class AgentKeys:
    def __init__(self) -> None:
        self._loaded: dict[str, _Loaded] = {}
        self._keyed: frozenset[str] = frozenset()

    def refresh(self, rules: RuleSet) -> None:
        """Read the key files the rules name (blocking: run it in a worker thread); a file
        whose stamp did not change is not read again."""
        loaded: dict[str, _Loaded] = {}
        for agent in rules.agents:
            if agent.key_file is None:
                continue
            path = str(Path(agent.key_file).expanduser())
            loaded[agent.agent_id] = self._read(agent.agent_id, path)
        self._loaded = loaded
        self._keyed = frozenset(loaded)

    def _read(self, agent: str, path: str) -> _Loaded:
        try:
            info = os.stat(path)
        except OSError as exc:
            return self._unreadable(agent, path, (0, 0, 0), exc.strerror or str(exc))
        stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        before = self._loaded.get(agent)
        if before is not None and before.path == path and before.stamp == stamp:
            return before
        try:
            with open(path, "rb") as handle:
                key = handle.read(_MAX_KEY_BYTES + 1).strip()
        except OSError as exc:
            return self._unreadable(agent, path, stamp, exc.strerror or str(exc))
        if not key or len(key) > _MAX_KEY_BYTES:
            return self._unreadable(agent, path, stamp, "empty or over 4 KiB")
        log.info("agent %s: key loaded from %s", agent, path)
        return _Loaded(path, stamp, key)

    def _unreadable(self, agent: str, path: str, stamp: tuple[int, int, int], why: str
                    ) -> _Loaded:
        before = self._loaded.get(agent)
        if before is None or before.key is not None or before.stamp != stamp:
            log.error("agent %s: its key file %s cannot be used (%s); its requests get "
                      "nothing of any session until it can", agent, path, why)
        return _Loaded(path, stamp, None)

    def verdict(self, agent: str | None, headers: Mapping[str, str]) -> KeyVerdict:
        """``open`` for an agent without a key (or no agent prefix); else whether the
        request carries the agent's key."""
        if agent is None or agent not in self._keyed:
            return "open"
        presented = headers.get("x-tailfloor-agent-key")
        if presented is None:
            return "missing"
        loaded = self._loaded.get(agent)
        if loaded is None or loaded.key is None:
            return "wrong"
        offered = presented.strip().encode("utf-8", "surrogateescape")
        return "ok" if hmac.compare_digest(offered, loaded.key) else "wrong"
