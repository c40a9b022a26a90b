"""What a newcomer reads when a port is taken: which listener, which flag moves it."""

from __future__ import annotations

import errno

__all__ = ["cannot_listen"]

_WHICH = {
    "proxy": ("the proxy listener", "--listen", "TAILFLOOR_LISTEN"),
    "admin": ("the admin listener", "--admin-listen", "TAILFLOOR_ADMIN_LISTEN"),
    "health": ("the health process's listener", "--health-listen", "TAILFLOOR_HEALTH_LISTEN"),
}


def cannot_listen(kind: str, where: str, exc: OSError) -> str:
    """One line naming the listener, the address, why, and the fix."""
    name, flag, env = _WHICH[kind]
    if exc.errno == errno.EADDRINUSE:
        return (f"{name} ({flag}, {env}) cannot bind {where}: address in use; another "
                f"tailfloor? pass {flag} 127.0.0.1:0 for a free port")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (f"{name} ({flag}, {env}) cannot bind {where}: permission denied; ports "
                f"below 1024 need privileges: pass {flag} with a port above 1024")
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"{name} ({flag}, {env}) cannot bind {where}: no such address on this "
                f"machine; pass {flag} 127.0.0.1:<port> or 0.0.0.0:<port>")
    return f"{name} ({flag}, {env}) cannot bind {where}: {exc.strerror or exc}"
