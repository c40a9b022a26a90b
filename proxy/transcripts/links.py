"""Which session came before which: sessions grouped by OpenClaw session key (within its
agent directory) and by Pi directory, and the groups whose links may have changed. Pure.

The catalog holds one ``Links`` and calls it under its own lock.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.transcripts.ordering import Groups
from proxy.transcripts.records import LinkKind, SessionInfo

__all__ = ["Links", "scoped"]


def scoped(info: SessionInfo) -> str | None:
    """A session key within its scope (keys repeat across agent directories)."""
    return f"{info.scope or ''}\x00{info.session_key}" if info.session_key else None


class Links:
    def __init__(self, order: Callable[[str], tuple[float, str]]) -> None:
        self._order = order
        # Sessions by OpenClaw session key (scoped) and by Pi directory, each in order.
        self._by_key = Groups(order)
        self._by_group = Groups(order)
        self._key_scopes: dict[str, set[str]] = {}
        # (table, name) whose links may change -> the sessions added to it (None: any may)
        self._relink: dict[tuple[int, str], set[str] | None] = {}

    def _tables(self, info: SessionInfo) -> tuple[tuple[int, Groups, str | None], ...]:
        return ((0, self._by_key, scoped(info)), (1, self._by_group, info.group))

    def add(self, info: SessionInfo) -> None:
        """A session is known, or its key or group may have changed."""
        if info.session_key:
            self._key_scopes.setdefault(info.session_key, set()).add(info.scope or "")
        for n, table, name in self._tables(info):
            if name and table.add(name, info.session_id):
                added = self._relink.setdefault((n, name), set())
                if added is not None:
                    added.add(info.session_id)

    def remove(self, info: SessionInfo) -> None:
        for n, table, name in self._tables(info):
            if name and table.remove(name, info.session_id):
                self._relink[(n, name)] = None

    def reorder(self, info: SessionInfo) -> None:
        """The session's start time changed: its groups sort again, and every link in them
        may move (its old neighbours and its new ones)."""
        for n, table, name in self._tables(info):
            if name:
                table.reorder(name)
                self._relink[(n, name)] = None

    def pending(self) -> set[str]:
        """The sessions whose links may have changed since the last call."""
        pending, self._relink = self._relink, {}
        todo: set[str] = set()
        for (n, name), added in pending.items():
            table = self._by_key if n == 0 else self._by_group
            if added is None:
                todo.update(table.members(name))
            else:
                # Only a new session and the one right after it can change links: a
                # directory of 20,000 sessions gaining one refreshes two, not 20,000.
                todo.update(added)
                todo.update(table.after(name, added))
        return todo

    def key_scopes(self, session_key: str) -> set[str]:
        return self._key_scopes.get(session_key, set())

    def key_members(self, scope: str, session_key: str) -> list[str]:
        """The sessions under a key in one scope, newest first."""
        return sorted(self._by_key.members(f"{scope}\x00{session_key}"), key=self._order,
                      reverse=True)

    def predecessor(self, info: SessionInfo) -> tuple[str | None, LinkKind | None]:
        """The session before this one and how they are linked (None, None: none)."""
        if info.predecessor:
            return info.predecessor, info.link
        name = scoped(info)
        if name:
            older = self._by_key.before(name, info.session_id)
            if older is not None:
                return older, "key_history"
        if info.group is not None:
            before = self._by_group.before(info.group, info.session_id)
            if before is not None:
                return before, "pi_directory"
        return None, None
