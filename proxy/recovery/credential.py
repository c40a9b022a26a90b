"""Compactions belong to the credential that paid for them.

A summary stored for one API key must not be reused for a request made with another: that
would tell one tenant what another sent (``x-tailfloor: reused`` for a prefix it only
guessed) and spend one tenant's summary on another. The store's session key therefore
carries a keyed hash of the request's credential (``Authorization``, else ``x-api-key``,
else ``api-key``); the credential itself is never stored.

The hash key: derived from the shared store's key when there is one (every replica must
agree); a fixed one with a shared store that has none (the store is then trusted as it is,
and tailfloor says so at start); else a random key kept in the ``--state`` directory, or
one per process.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
from collections.abc import Mapping
from pathlib import Path

__all__ = ["CREDENTIAL_HEADERS", "CredentialScopes", "credential_scope", "scope_keys"]

CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key")
_KEY_FILE = "credential-scope.key"
_UNKEYED = b"tailfloor credential scope (shared store without a key)"
log = logging.getLogger("tailfloor.recovery")


def credential_scope(headers: Mapping[str, str], key: bytes) -> str | None:
    """A short keyed hash of the request's credential, or None when it sends none."""
    for name in CREDENTIAL_HEADERS:
        value = headers.get(name)
        if value:
            text = f"{name}\x00{value.strip()}".encode("utf-8", "surrogateescape")
            return hmac.new(key, text, hashlib.sha256).hexdigest()[:32]
    return None


class CredentialScopes:
    """``credential_scope`` of a request under each key (the current one first), remembered
    per credential: an agent sends the same credential with every request, and each hash is
    an HMAC (~3 us), where the lookup is ~0.1 us. Keyed by the exact header and value, so a
    hit is that credential's own hashes; at most ``MAX_KEPT`` credentials are kept (all
    forgotten at once past it). The credentials it holds are never logged nor shown: its repr
    counts them."""

    MAX_KEPT = 4096

    def __init__(self, keys: tuple[bytes, ...] = ()) -> None:
        self.keys = keys
        self._kept: dict[tuple[str, str], tuple[str, ...]] = {}
        self._lock = threading.Lock()  # requests with large bodies are viewed in worker threads

    def of(self, headers: Mapping[str, str]) -> tuple[str, ...] | None:
        """The hashes under each key, or None when the request sends no credential."""
        for name in CREDENTIAL_HEADERS:
            value = headers.get(name)
            if value:
                key = (name, value)
                found = self._kept.get(key)
                if found is None:
                    one = {name: value}
                    found = tuple(credential_scope(one, k) or "" for k in self.keys)
                    with self._lock:
                        if len(self._kept) >= self.MAX_KEPT:
                            self._kept.clear()
                        self._kept[key] = found
                return found
        return None

    def first(self, headers: Mapping[str, str]) -> str:
        """The hash under the current key, or "" when the request sends no credential."""
        hashes = self.of(headers)
        return hashes[0] if hashes else ""

    def __repr__(self) -> str:
        return f"CredentialScopes({len(self.keys)} keys, {len(self._kept)} credentials kept)"


def scope_keys(store_keys: tuple[bytes, ...] | None, state: Path | None
               ) -> tuple[bytes, ...]:
    """The keys credential hashes are made with, the current one first (blocking: reads or
    writes a file). ``store_keys``: None without a shared store, else its keys (the current
    one first; possibly none)."""
    if store_keys is not None:
        if not store_keys:
            return (_UNKEYED,)
        return tuple(hmac.new(k, b"credential-scope", hashlib.sha256).digest()
                     for k in store_keys)
    return (_local_key(state),)


def _local_key(state: Path | None) -> bytes:
    if state is None:
        return secrets.token_bytes(32)
    path = state / _KEY_FILE
    try:
        data = path.read_bytes()
        if len(data) == 32:
            return data
    except OSError:
        pass
    key = secrets.token_bytes(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key)
    except OSError as exc:
        log.warning("cannot keep the credential scope key in %s (%s): compactions stored "
                    "now will not be reused after a restart", path, exc.strerror or exc)
    return key
