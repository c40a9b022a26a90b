"""What parsing a chat request body would cost, read from its bytes before it is parsed. Pure.

Parsing is one call that holds the interpreter (every other request, ``/healthz`` too) from
start to end, and its result can weigh many times the body: a body of tiny JSON values (``[]``,
``"a"``, each a Python object) weighs 15-20 times its bytes parsed and takes seconds where text
of the same size takes milliseconds, and one character outside the Basic Multilingual Plane
makes Python hold a whole text at four bytes a character. So the cost is estimated first:

- ``values``: the body's commas, plus one. Every JSON value but the first of its array or
  object follows a comma, and the only other way to many values is nesting, which the parser
  stops at 1,024 levels. Commas inside text count too: an estimate from above, never below.
- ``wide``: the body has bytes outside ASCII or ``\\u`` escapes, so its text may be held at up
  to four bytes a character (else one).

From them, ``memory``: the bytes a request holds from its parse to its end (the body, its
parsed form, a dialect's translation and the chat bytes made of it, the texts the stages
join), an estimate from above fitted to tests/bench/hostile_load.py's kinds of body.
A body over ``MAX_VALUES`` is not parsed (forwarded as it came); one that is, holds
``memory`` of the body budget (``held_bodies.py``) until its request ends.
"""

from __future__ import annotations

from proxy.server.body_prefixes import MIN_BYTES, RecentBodies
from proxy.values import frozen_value

__all__ = ["MAX_PARSED_BYTES", "MAX_VALUES", "BodyCost", "body_cost"]

# A body above either bound is not parsed; it is forwarded as it came, counted
# (x-tailfloor: none; reason=too_large). Parsing 8 MiB of text, or 100,000 values, holds the
# interpreter ~10-30 ms (the worst measured on a busy 2-core machine: ~60 ms for 100,000
# values in two-member objects).
MAX_PARSED_BYTES = 8 * 1024 * 1024
MAX_VALUES = 100_000
# A parsed value beside its text: its object (a str's or an empty list's ~50-60 bytes, a
# two-member object's ~110 per member) and the pointer to it; rounded up.
VALUE_BYTES = 128
WIDTH = 4  # bytes a character of text, at most, once parsed


@frozen_value
class BodyCost:
    size: int
    values: int
    wide: bool
    dialect: bool  # translated (Responses, Messages): a second parsed form, and its bytes

    @property
    def parsable(self) -> bool:
        return self.size <= MAX_PARSED_BYTES and self.values <= MAX_VALUES

    @property
    def memory(self) -> int:
        """Bytes held from the parse to the request's end, the body's own included."""
        text = self.size * (WIDTH if self.wide else 1)
        parsed = text + self.values * VALUE_BYTES
        if self.dialect:
            parsed = 2 * parsed + self.size
        return self.size + parsed + text  # the texts the stages join (the current turn's)


def body_cost(raw: bytes, *, dialect: bool, recent: RecentBodies | None = None,
              owner: str = "") -> BodyCost:
    """The cost of ``raw``: up to three passes over its bytes, each one call (a large body's
    in a worker thread, as its parse), only past the start it shares with a body of
    ``recent`` (``body_prefixes.py``: the same counts, found for less); a body that will not
    be parsed is not looked at for wide text."""
    if recent is None or not MIN_BYTES <= len(raw) <= MAX_PARSED_BYTES:
        values = raw.count(b",") + 1
        if len(raw) > MAX_PARSED_BYTES or values > MAX_VALUES:
            return BodyCost(len(raw), values, False, dialect)
        return BodyCost(len(raw), values, not raw.isascii() or b"\\u" in raw, dialect)
    found = recent.counted(raw, MAX_VALUES - 1, owner=owner)
    if isinstance(found, int):
        return BodyCost(len(raw), found + 1, False, dialect)
    return BodyCost(len(raw), found.total + 1, not found.ascii or found.escape >= 0, dialect)
