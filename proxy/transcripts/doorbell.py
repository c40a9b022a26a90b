"""A doorbell for directory trees: an inotify descriptor the event loop waits on.

watchfiles' Rust watcher gathers changes all the time, but it is asked for them by polling:
every ``step`` ms a thread wakes and takes the interpreter lock, about 100 times a second
with nothing happening. The doorbell says *when* to ask: it watches the same directories
(inotify reports what happens to a directory's entries), and the event loop sleeps on its
descriptor, so a quiet process does not wake at all. What it reports is only "something
happened"; the changes themselves still come from the Rust watcher.

Linux only: ``Doorbell.open`` returns None elsewhere (or when inotify is not available),
and the caller keeps polling.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import os
import struct
from collections.abc import Callable, Iterable, Iterator

__all__ = ["Doorbell", "events"]
_AddWatch = Callable[[int, bytes, int], int]

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_IGNORED = 0x8000  # the watch is gone (its directory deleted)
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
        | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
EVENT_HEAD = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name


def events(data: bytes) -> Iterator[tuple[int, int, str]]:
    """(watch descriptor, mask, name) of each inotify event in ``data``."""
    at = 0
    while at + EVENT_HEAD.size <= len(data):
        wd, mask, _cookie, length = EVENT_HEAD.unpack_from(data, at)
        at += EVENT_HEAD.size
        yield wd, mask, os.fsdecode(data[at:at + length].split(b"\0", 1)[0])
        at += length


class Doorbell:
    """inotify watches on directory trees; ``rung`` waits until something happened."""

    def __init__(self, fd: int, add_watch: _AddWatch) -> None:
        self._fd = fd
        self._add = add_watch
        self._dirs: dict[int, str] = {}  # watch descriptor -> directory
        self.failed = False  # a directory that exists could not be watched

    @classmethod
    def open(cls) -> Doorbell | None:
        name = ctypes.util.find_library("c")
        if not hasattr(os, "O_NONBLOCK") or name is None:
            return None
        try:
            libc = ctypes.CDLL(name, use_errno=True)
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError):
            return None
        add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        fd = init(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            return None
        return cls(fd, add)

    def close(self) -> None:
        os.close(self._fd)

    def watch_trees(self, roots: Iterable[str]) -> int:
        """Watch every directory under ``roots`` (disk work: off the event loop); how many
        are watched in all."""
        for root in roots:
            self._watch_tree(root)
        return len(self._dirs)

    def directories(self) -> list[str]:
        """Every directory watched now."""
        return list(self._dirs.values())

    def _watch_tree(self, root: str) -> None:
        # Each directory is watched before it is listed: one made in it meanwhile rings
        # (listed first, it would be neither listed nor reported, and never watched).
        pending = [root]
        while pending:
            here = pending.pop()
            wd = self._add(self._fd, os.fsencode(here), MASK)
            if wd >= 0:
                self._dirs[wd] = here
            elif ctypes.get_errno() not in (errno.ENOENT, errno.ENOTDIR):
                self.failed = True  # e.g. the user's inotify watches used up
            try:
                with os.scandir(here) as entries:
                    pending += [e.path for e in entries if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue

    async def rung(self, stop: asyncio.Event, within: float) -> list[str] | None:
        """Wait until an event arrived (at most ``within`` s, or until ``stop``), then take
        every event pending: the directories that appeared in watched ones (to watch with
        ``watch_trees``, off the loop), or None when nothing came."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        stopped = asyncio.ensure_future(stop.wait())

        def ring() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(self._fd, ring)
        try:
            await asyncio.wait((ready, stopped), timeout=within,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            loop.remove_reader(self._fd)
            stopped.cancel()
            ready.cancel()
        # A storm of new files is tens of thousands of events to read: not on the loop.
        return await asyncio.to_thread(self._drain)

    def _drain(self) -> list[str] | None:
        """The new directories among the pending events; None when none was pending."""
        found: list[str] | None = None
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return found
            found = found if found is not None else []
            for wd, mask, name in events(data):
                if mask & IN_IGNORED:
                    self._dirs.pop(wd, None)
                elif mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO) and name:
                    parent = self._dirs.get(wd)
                    if parent is not None:
                        found.append(os.path.join(parent, name))
