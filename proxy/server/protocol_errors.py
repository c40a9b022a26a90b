"""Malformed HTTP from clients, as aiohttp's server reports it.

aiohttp logs every request its parser refuses (and answers 400) at ERROR with a traceback
whose message quotes the offending bytes, headers and credentials included. That is a client
mistake, not ours: counted, logged at INFO without the quoted bytes, at most once a minute
(with how many were left out).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["ClientProtocolErrors", "install"]

SERVER_LOGGER = "aiohttp.server"


class ClientProtocolErrors(logging.Filter):
    def __init__(self, count: Callable[[], None], every: float = 60.0) -> None:
        super().__init__()
        self._count = count
        self._every = every
        self._last = -every
        self._left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        self._count()
        if not logging.getLogger().isEnabledFor(logging.INFO):
            return False  # logged at INFO: not at all under --log-level WARNING
        now = time.monotonic()
        if now - self._last < self._every:
            self._left_out += 1
            return False
        self._last = now
        left_out, self._left_out = self._left_out, 0
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg = "malformed HTTP request refused with 400 (%s, status %s)%s"
        record.args = (type(error).__name__, error.code,
                       f"; {left_out} more since the last such line" if left_out else "")
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def install(count: Callable[[], None]) -> ClientProtocolErrors:
    """Put the filter on aiohttp's server logger (replacing one installed before)."""
    logger = logging.getLogger(SERVER_LOGGER)
    for old in [f for f in logger.filters if isinstance(f, ClientProtocolErrors)]:
        logger.removeFilter(old)
    found = ClientProtocolErrors(count)
    logger.addFilter(found)
    return found
