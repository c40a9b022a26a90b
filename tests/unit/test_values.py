"""``frozen_value`` (proxy/values.py): frozen to mypy, plain at run time, and at run time
everything a frozen dataclass allows works the same (mypy refuses the rest)."""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib
import inspect
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from proxy.values import frozen_value

PACKAGE = Path(__file__).resolve().parents[2] / "proxy"


@frozen_value
class Value:
    number: int
    text: str = "x"
    items: tuple[int, ...] = field(default_factory=tuple)
    hidden: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class FrozenTwin:
    number: int
    text: str = "x"
    items: tuple[int, ...] = field(default_factory=tuple)
    hidden: int = field(default=0, compare=False)


@frozen_value
class OwnEquality:  # noqa: PLW1641  (the decorator writes __hash__)
    """A class that writes its __eq__ (Python then sets __hash__ to None in its body): a
    frozen dataclass still hashes it by fields."""

    number: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OwnEquality) and other.number == self.number


@frozen_value
class OwnHash:
    number: int

    def __hash__(self) -> int:
        return 7


def test_the_runtime_class_is_a_plain_slotted_dataclass() -> None:
    params = Value.__dataclass_params__  # type: ignore[attr-defined]
    assert not params.frozen and params.eq
    assert Value.__slots__ == ("number", "text", "items", "hidden")
    assert not hasattr(Value(1), "__dict__")


def test_it_does_what_the_frozen_twin_does() -> None:
    """Construction, defaults, repr, equality and hash by the compared fields, replace,
    fields, pickle, copy, match: the same as the frozen dataclass it stands for."""
    assert inspect.signature(Value) == inspect.signature(FrozenTwin)
    assert [f.name for f in dataclasses.fields(Value)] == \
        [f.name for f in dataclasses.fields(FrozenTwin)]
    for args in [(1,), (1, "y"), (1, "y", (2, 3)), (1, "y", (), 9)]:
        ours, theirs = Value(*args), FrozenTwin(*args)
        assert repr(ours).replace("Value", "FrozenTwin") == repr(theirs)
        assert hash(ours) == hash(theirs)
        assert ours == Value(*args) and hash(ours) == hash(Value(*args))
        assert pickle.loads(pickle.dumps(ours)) == ours
        assert copy.copy(ours) == ours and copy.deepcopy(ours) == ours
        assert dataclasses.astuple(ours) == dataclasses.astuple(theirs)
    assert Value(1, hidden=1) == Value(1, hidden=2)  # compare=False, as in the twin
    assert hash(Value(1, hidden=1)) == hash(Value(1, hidden=2))
    assert Value(1) != Value(2) and Value(1) != FrozenTwin(1)
    assert dataclasses.replace(Value(1), text="z") == Value(1, "z")
    assert {Value(1): "a"}[Value(1)] == "a" and len({Value(1), Value(1), Value(2)}) == 2
    assert Value.__match_args__ == FrozenTwin.__match_args__
    match Value(4, "t"):
        case Value(number, text):
            assert (number, text) == (4, "t")


@dataclass(frozen=True, slots=True)
class OwnEqualityTwin:  # noqa: PLW1641  (the decorator writes __hash__)
    number: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OwnEqualityTwin) and other.number == self.number


def test_a_class_of_its_own_equality_or_hash_keeps_the_frozen_rules() -> None:
    assert hash(OwnEquality(3)) == hash(OwnEqualityTwin(3)) == hash((3,))
    assert OwnEquality(3) == OwnEquality(3)
    assert hash(OwnHash(1)) == 7


def _decorated() -> list[type]:
    """Every class of proxy/ written with @frozen_value."""
    found: list[type] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                 and any(isinstance(d, ast.Name) and d.id == "frozen_value"
                         for d in node.decorator_list)]
        if names:
            module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
            found.extend(getattr(importlib.import_module(module), name) for name in names)
    return found


@pytest.mark.parametrize("cls", _decorated(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_value_record_is_hashable_and_slotted(cls: type) -> None:
    """What the frozen dataclasses they were promised: slots, equality, a hash by fields
    unless the class writes one (a record used as a key or set member stays one)."""
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    assert params.eq and not params.frozen and not params.order
    assert "__slots__" in cls.__dict__
    assert cls.__hash__ is not None  # type: ignore[comparison-overlap]


def test_mypy_sees_a_frozen_dataclass() -> None:
    """An assignment to a field is a type error (what keeps the records values), the
    constructor is checked as a dataclass's."""
    api = pytest.importorskip("mypy.api")
    snippet = PACKAGE.parent / "tests" / "unit" / "_frozen_value_snippet.py"
    snippet.write_text(
        "from proxy.values import frozen_value\n\n"
        "@frozen_value\nclass V:\n    a: int\n    b: str = 'x'\n\n"
        "v = V(1)\nv.a = 2\nV(1, 'y', 3)\nkeyed = {v: 1}\n")
    try:
        out, _, status = api.run(["--strict", "--no-incremental", "--follow-imports=silent",
                                  str(snippet)])
    finally:
        snippet.unlink()
    assert status == 1
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 2, out
    assert ':9: error: Property "a" defined in "V" is read-only' in errors[0]
    assert ":10: error: Too many arguments" in errors[1]
