"""``frozen_value``: the records the request path makes on every request, frozen for mypy,
plain at run time.

A frozen dataclass's ``__init__`` sets every field through ``object.__setattr__`` (a call
per field, to get past the ``__setattr__`` that refuses assignments): the request path
makes about fifteen such records (~80 fields) per request, a measurable share of its
instructions (docs/benchmarks.md, "Instructions per request"). A class decorated with
``frozen_value`` is, to mypy, ``@dataclass(frozen=True, slots=True)``: assigning a field is
a type error, as before, and that is what keeps them values. At run time it is a slotted
dataclass whose ``__init__`` assigns its fields directly, with ``__eq__`` and ``__hash__``
by fields as a frozen one has (instances stay usable as dict keys and set members).
tests/unit/test_values.py checks both sides.

Only for classes written as ``@dataclass(frozen=True, slots=True)`` with no other option.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field
from typing import TypeVar, dataclass_transform

__all__ = ["frozen_value"]

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def frozen_value(cls: type[T]) -> type[T]:
    # The hash a frozen dataclass would have: by fields, unless the class writes its own
    # (a class body that defines __eq__ alone gets __hash__ = None, which is not its own).
    own = cls.__dict__.get("__hash__", MISSING)
    explicit = not (own is MISSING or (own is None and "__eq__" in cls.__dict__))
    return dataclass(slots=True, unsafe_hash=not explicit)(cls)
