"""The package keeps its shape: small modules, pure cores, imports that only point down.

- every module of proxy/ has at most 400 lines;
- wire/, the floor's and recovery's pure modules and the transcript catalog import no aiohttp,
  asyncio, watchfiles, prometheus_client or file/process/network I/O, and call no ``open``;
- only server/ and upstream/ import aiohttp;
- nothing outside server/ and cli/ imports server/ or cli/ (the request path's layers below
  never reach back up);
- no ``create_task`` whose task is dropped (a task nobody references can be collected
  mid-flight).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "proxy"
MAX_LINES = 400
PURE = [
    "wire/*.py",
    "floor/decision.py", "identity/*.py", "floor/restore.py",
    "floor/carry.py", "floor/style.py",
    "recovery/plan.py", "recovery/detect.py", "recovery/patterns.py", "recovery/silent.py",
    "recovery/message_chain.py", "recovery/request.py", "recovery/outcome.py",
    "facts/*.py", "recovery/output.py", "recovery/compacted.py",
    "recovery/summarize/prompt.py",
    "recovery/summarize/chunks.py",
    "recovery/summarize/response.py",
    "transcripts/catalog.py", "transcripts/entries.py", "transcripts/view.py",
    "transcripts/index.py", "transcripts/records.py", "transcripts/render.py",
    "transcripts/state.py", "transcripts/ordering.py", "transcripts/packed.py",
    "transcripts/links.py", "transcripts/served.py", "replicas/health.py",
    "context.py", "chat.py", "answer.py", "report.py", "errors.py",
    "inspector/store.py", "inspector/facts.py", "inspector/pages.py",
    "telemetry/config.py", "telemetry/tracecontext.py", "telemetry/attributes.py",
    "telemetry/framing.py", "upstream/chunked.py",
]
IMPURE = frozenset({"aiohttp", "asyncio", "watchfiles", "prometheus_client", "os", "io",
                    "pathlib", "sqlite3", "shutil", "tempfile", "socket", "subprocess",
                    "uvloop", "multidict"})


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def name_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def top(name: str) -> str:
    return name.split(".", 1)[0]


@pytest.mark.parametrize("path", modules(), ids=name_of)
def test_modules_are_small(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{name_of(path)} has {lines} lines (at most {MAX_LINES})"


def pure_modules() -> list[Path]:
    found: set[Path] = set()
    for pattern in PURE:
        matched = sorted(PACKAGE.glob(pattern))
        assert matched, f"no module matches {pattern}: keep PURE in step with the layout"
        found.update(matched)
    return sorted(found)


@pytest.mark.parametrize("path", pure_modules(), ids=name_of)
def test_pure_modules_do_no_io(path: Path) -> None:
    bad = sorted(i for i in imports(path) if top(i) in IMPURE)
    assert not bad, f"{name_of(path)} imports {bad}"
    calls = [node for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id == "open"]
    assert not calls, f"{name_of(path)} calls open()"


@pytest.mark.parametrize("path", modules(), ids=name_of)
def test_imports_point_down(path: Path) -> None:
    name = name_of(path)
    layer = name.split(".")[1] if name.count(".") else ""
    found = imports(path)
    if layer not in ("server", "upstream"):
        assert not any(top(i) == "aiohttp" for i in found), f"{name} imports aiohttp"
    if layer not in ("server", "cli", "__main__"):
        up = sorted(i for i in found if i.startswith(("proxy.server", "proxy.cli")))
        assert not up, f"{name} imports {up}: nothing reaches back up into server/ or cli/"


@pytest.mark.parametrize("path", modules(), ids=name_of)
def test_no_task_is_dropped(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            assert called not in ("create_task", "ensure_future"), (
                f"{name_of(path)} line {node.lineno}: keep a reference to the task")


def package_of(name: str) -> str:
    """The layer a module belongs to: its folder under proxy/, or a top-level module itself."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_imports() -> dict[str, dict[str, str]]:
    """For each layer, the layers it imports, with one module that does."""
    found: dict[str, dict[str, str]] = {}
    for path in modules():
        name = name_of(path)
        mine = package_of(name)
        for target in imports(path):
            if target.startswith("proxy."):
                other = package_of(target)
                if other != mine:
                    found.setdefault(mine, {}).setdefault(other, name)
    return found


def test_no_two_packages_import_each_other() -> None:
    """Imports between layers point one way: a layer that imports another is never imported
    by it, directly or through others (context.py once imported floor/ and recovery/, which
    both import it)."""
    edges = package_imports()

    def reaches(start: str, goal: str) -> list[str] | None:
        seen, stack = {start}, [[start]]
        while stack:
            path = stack.pop()
            for nxt in edges.get(path[-1], {}):
                if nxt == goal:
                    return [*path, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append([*path, nxt])
        return None

    for layer, targets in sorted(edges.items()):
        for target, module in sorted(targets.items()):
            back = reaches(target, layer)
            assert back is None, (f"{module} imports {target}, and {target} reaches back to "
                                  f"{layer}: {' -> '.join(back)}")
