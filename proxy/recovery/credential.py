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
from collections.abc import Mapping
from pathlib import Path

__all__ = ["CREDENTIAL_HEADERS", "credential_scope", "scope_keys"]

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
