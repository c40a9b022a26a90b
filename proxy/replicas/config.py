"""Where the shared store is: ``--store URL`` read and checked (and the password file read).

``redis://[user:password@]host[:port][/db]`` and ``rediss://`` (TLS). A password may come from
the URL or, better (a URL shows in process listings and manifests), from a file named by
``TAILFLOOR_STORE_PASSWORD_FILE`` (a mounted Secret); the file wins. ``rediss://`` trusts the
system's CAs, or those in ``TAILFLOOR_STORE_CA_FILE``. The password is kept out
of every string form of the result, so a log line or an error message cannot leak it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["StoreURL", "parse_store_url"]

_SCHEMES = {"redis": False, "rediss": True}
_MAX_PASSWORD_FILE = 64 * 1024


@dataclass(frozen=True)
class StoreURL:
    host: str
    port: int
    db: int
    tls: bool
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: Path | None = None  # rediss://: CA certificates to trust (default: the system's)
    # The keys that seal what is written (the first) and are accepted when read (all):
    # TAILFLOOR_STORE_KEY_FILE, then TAILFLOOR_STORE_PREVIOUS_KEY_FILE (proxy/replicas/signing.py).
    keys: tuple[bytes, ...] = field(default=(), repr=False)
    # Seconds one round trip may take (TAILFLOOR_STORE_TIMEOUT_MS): a store slower than
    # this is treated as down for a while, and the replica goes on alone.
    timeout: float = 0.25

    def __str__(self) -> str:
        """The URL without its credentials: the form every log line uses."""
        scheme = "rediss" if self.tls else "redis"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}/{self.db}"


def parse_store_url(url: str, password_file: Path | None = None,
                    ca_file: Path | None = None) -> StoreURL:
    """The store's address, or ValueError naming what is wrong (never the password)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in _SCHEMES:
        raise ValueError("the store URL must start with redis:// or rediss://")
    try:
        port = parts.port or 6379
    except ValueError:
        raise ValueError("the store URL has an invalid port") from None
    host = parts.hostname
    if not host:
        raise ValueError("the store URL has no host")
    if parts.query or parts.fragment:
        raise ValueError("the store URL must not carry a query or fragment")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ValueError("the store URL's path must be a database number, e.g. /0")
    password = unquote(parts.password) if parts.password else None
    if password_file is not None:
        password = read_password(password_file)
    if ca_file is not None and not ca_file.is_file():
        raise ValueError(f"the store CA file {str(ca_file)!r} is not a file")
    if ca_file is not None and parts.scheme != "rediss":
        raise ValueError("a store CA file needs a rediss:// (TLS) URL")
    return StoreURL(host=host, port=port, db=int(path or 0), tls=_SCHEMES[parts.scheme],
                    username=unquote(parts.username) if parts.username else None,
                    password=password, ca_file=ca_file)


def read_password(path: Path) -> str:
    """The first line of a password file (a Secret mounted as a file ends with a newline)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_PASSWORD_FILE + 1)
    except OSError as exc:
        raise ValueError(f"cannot read the store password file {str(path)!r}: "
                         f"{exc.strerror or exc}") from None
    if len(data) > _MAX_PASSWORD_FILE:
        raise ValueError(f"the store password file {str(path)!r} is too large")
    text = data.decode("utf-8", errors="replace").splitlines()
    if not text or not text[0]:
        raise ValueError(f"the store password file {str(path)!r} is empty")
    return text[0]
