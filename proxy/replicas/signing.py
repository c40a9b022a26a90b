"""Values in the shared store that nobody without the key can forge.

Anyone who can write to the Redis tailfloor shares could otherwise plant a summary (which
every replica would send to the model as the conversation's history), a context window (so
requests get compacted or refused) or a fingerprint (so a stranger's request is given a
session's carry). With ``TAILFLOOR_STORE_KEY_FILE`` every value tailfloor writes is sealed
with HMAC-SHA256 over the Redis key, the hash field and the value; a value that fails the
check is treated as absent and counted (``tailfloor_store_errors_total{kind="forged"}``).
``TAILFLOOR_STORE_PREVIOUS_KEY_FILE`` names the key being rotated out: values sealed with it
are still accepted, new ones are sealed with the current key.

Without a key, values are written and read as they are (and tailfloor says at start that
the store is trusted as is). Pure: no I/O besides reading the key files at start.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["Signer", "read_key"]

_LOG = logging.getLogger("tailfloor.store")
_TAG = b"s1."
_MAC_HEX = 64
_MAX_KEY_FILE = 4096


def read_key(path: Path) -> bytes:
    """A key file's bytes (surrounding whitespace dropped), or ValueError naming the file."""
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_KEY_FILE + 1).strip()
    except OSError as exc:
        raise ValueError(f"cannot read the store key file {str(path)!r}: "
                         f"{exc.strerror or exc}") from None
    if len(data) > _MAX_KEY_FILE:
        raise ValueError(f"the store key file {str(path)!r} is over {_MAX_KEY_FILE} bytes")
    if len(data) < 16:
        raise ValueError(f"the store key file {str(path)!r} holds under 16 bytes")
    return data


class Signer:
    def __init__(self, keys: Sequence[bytes] = (),
                 on_forged: Callable[[], None] = lambda: None) -> None:
        """``keys``: the current key first, then any still accepted; none: no sealing."""
        self._keys = tuple(keys)
        self._on_forged = on_forged
        self._episode = False  # a forged value was logged and none verified since

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def _mac(self, key: bytes, where: str, value: bytes) -> bytes:
        place = where.encode("utf-8", "surrogatepass")
        message = len(place).to_bytes(4, "big") + place + value
        return hmac.new(key, message, hashlib.sha256).hexdigest().encode()

    def seal(self, where: str, value: bytes) -> bytes:
        """``value`` as stored under ``where`` (the Redis key, and the field for a hash)."""
        if not self._keys:
            return value
        return _TAG + self._mac(self._keys[0], where, value) + b"." + value

    def unseal(self, where: str, raw: bytes | str | None) -> bytes | None:
        """The value stored under ``where``, or None when absent or forged."""
        if raw is None:
            return None
        data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
        if not self._keys:
            return data
        head = len(_TAG) + _MAC_HEX
        if data.startswith(_TAG) and data[head:head + 1] == b".":
            mac, value = data[len(_TAG):head], data[head + 1:]
            for key in self._keys:
                if hmac.compare_digest(mac, self._mac(key, where, value)):
                    self._episode = False
                    return value
        self._forged(where)
        return None

    def _forged(self, where: str) -> None:
        self._on_forged()
        if not self._episode:
            self._episode = True
            # The key name only: the value may be anything an attacker chose.
            _LOG.warning("the shared store holds a value tailfloor did not write (%s fails "
                         "its signature check): ignored as absent; further ones are only "
                         "counted until a value checks again", where[:200])
