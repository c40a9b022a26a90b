"""The documentation stays true to the code.

- every relative link and ``#anchor`` in README.md, docs/*.md and rules/README.md resolves
  (GitHub's anchors: lowercase, punctuation dropped, spaces to ``-``, ``-1``... for repeats);
- every flag of every ``tailfloor`` command (from the argparse parser itself) is in that
  command's section of docs/configuration.md, and every flag there still exists; every
  ``TAILFLOOR_*`` variable the code reads is documented there, and every one documented
  there (or anywhere in the docs) still exists in the code or the tests;
- every metric a fresh ``Metrics`` registers is in the metrics table of docs/observability.md
  with its type and labels, and the table names nothing else;
- every config snippet the docs show is a file of docs/snippets, shown verbatim where it is
  included, and parses; the live agent tests build their providers from those files
  (tests/agents/snippets.py: the keys, the api and the URL's path are the file's), and the
  checks here make sure that is still so.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import runpy
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from proxy import settings
from proxy.cli.main import build_parser
from proxy.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "rules" / "README.md"]
CONFIGURATION = DOCS / "configuration.md"
SNIPPETS = DOCS / "snippets"
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FLAG = re.compile(r"(?<![\w-])--(\[no-\])?([a-z][a-z0-9-]*)")
ENV = re.compile(r"TAILFLOOR_[A-Z0-9_]*[A-Z0-9]")
SNIPPET = re.compile(r"^<!-- snippet: (\S+) -->$")


# ---------------------------------------------------------------- Markdown, read simply

def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(text):
        match = re.match(r"^#{1,6} +(.+?) *#* *$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[str]:
    targets = []
    for line in prose_lines(text):
        targets += LINK.findall(re.sub(r"`[^`]*`", "", line))  # code spans hold no links
    return targets


def broken_links(page: Path) -> list[str]:
    problems = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            problems.append(f"{page.name}: {target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            problems.append(f"{page.name}: {target}: no such anchor")
        elif anchor and resolved.suffix != ".md":
            problems.append(f"{page.name}: {target}: an anchor into a file that is not Markdown")
    return problems


def sections(text: str) -> dict[str, str]:
    """Each ``## `` section's text by its heading (code spans unwrapped)."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = out.setdefault(line[3:].strip().strip("`"), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in out.items()}


def documented_flags(text: str) -> set[str]:
    flags = set()
    for no, name in FLAG.findall(text):
        flags.add("--" + name)
        if no:
            flags.add("--no-" + name)
    return flags


# ---------------------------------------------------------------- links and pages

def test_slugs_follow_github() -> None:
    assert slug("`tailfloor serve`") == "tailfloor-serve"
    assert slug("Pinned messages: what must never be summarized away") == \
        "pinned-messages-what-must-never-be-summarized-away"
    assert slug("What a Python proxy on these parts can cost at least (`--with-floors`)") == \
        "what-a-python-proxy-on-these-parts-can-cost-at-least---with-floors"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_the_link_check_finds_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Here it is\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Top\n\n[ok](other.md#here-it-is) [ok](#top) "
                    "[gone](missing.md) [bad](other.md#nowhere) [bad](#bottom) "
                    "`[not a link](nowhere.md)` [web](https://example.com/x#y)\n\n"
                    "```\n[in code](nowhere.md)\n```\n")
    assert broken_links(page) == ["page.md: missing.md: no such file",
                                  "page.md: other.md#nowhere: no such anchor",
                                  "page.md: #bottom: no such anchor"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_anchors_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_pattern_sees_the_docs_links() -> None:
    readme = links((ROOT / "README.md").read_text())
    assert {f"docs/{p.name}" for p in DOCS.glob("*.md")} <= set(readme)
    assert "docs/inspector-floor.png" in readme


def test_every_docs_page_opens_with_what_it_answers_and_is_in_the_readme_table() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in sorted(DOCS.glob("*.md")):
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# "), page
        assert lines[1] == "" and lines[2] and not lines[2].startswith(("#", "|", "-", "`")), page
        assert f"](docs/{page.name})" in readme, f"{page.name} is not in the README's table"


def test_the_readme_is_short_and_names_the_defaults_it_promises() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    setup = readme.split("<!-- setup:begin -->")[1].split("<!-- setup:end -->")[0]
    assert ".venv/bin/pip install . && .venv/bin/tailfloor serve" in setup
    assert "bash .ci/test" in setup and (ROOT / ".ci" / "test").exists()
    assert f"`{settings.DEFAULT_LISTEN}`" in setup and f"`{settings.DEFAULT_UPSTREAM}`" in setup
    assert f"http://{settings.DEFAULT_LISTEN}/v1" in setup


# ---------------------------------------------------------------- flags and variables

def commands() -> dict[str, argparse.ArgumentParser]:
    """Every parser of the command line by its command (``tailfloor rules check``...)."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        found[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(child, f"{name} {sub}")

    walk(build_parser(), "tailfloor")
    return found


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings
            if flag not in ("-h", "--help")}


def test_the_parser_walk_sees_every_command() -> None:
    assert {"tailfloor serve", "tailfloor rules check", "tailfloor sessions",
            "tailfloor inspect", "tailfloor demo"} <= set(commands())
    assert {"--listen", "--no-access-log", "--no-tailfloor-header"} <= \
        options(commands()["tailfloor serve"])
    assert documented_flags("`--[no-]access-log`, `--json`, x--y") == \
        {"--access-log", "--no-access-log", "--json"}


@pytest.mark.parametrize("command", sorted(commands()))
def test_every_flag_of_every_command_is_documented_and_nothing_more(command: str) -> None:
    flags = options(commands()[command])
    if not flags:
        return  # a parser with only subcommands (``tailfloor rules``)
    by_heading = sections(CONFIGURATION.read_text())
    assert command in by_heading, f"docs/configuration.md has no section `{command}`"
    documented = documented_flags(by_heading[command])
    assert sorted(flags - documented) == [], f"undocumented flags of {command}"
    assert sorted(documented - flags - {"--help"}) == [], \
        f"documented flags {command} does not have"


def serve_variables() -> dict[str, str]:
    """Each serve flag's variable as its help names it: flag -> TAILFLOOR_..."""
    parser = commands()["tailfloor serve"]
    out = {}
    for action in parser._actions:
        named = re.search(r"\(env (TAILFLOOR_[A-Z0-9_]+)", action.help or "")
        if named:
            for flag in action.option_strings:
                out[flag] = named.group(1)
    return out


def code_variables() -> set[str]:
    """TAILFLOOR_* names the package's code reads: string literals (docstrings and comments
    left out) and ``ENV_PREFIX + "NAME"``."""
    names: set[str] = set()
    for path in (ROOT / "proxy").rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                    | ast.AsyncFunctionDef)
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docstrings:
                names.update(ENV.findall(node.value))
            if isinstance(node, ast.BinOp) and isinstance(node.left, ast.Name) \
                    and node.left.id == "ENV_PREFIX" and isinstance(node.right, ast.Constant):
                names.add(settings.ENV_PREFIX + str(node.right.value))
    return names


def test_the_variable_search_finds_what_the_code_reads() -> None:
    found = code_variables()
    assert {"TAILFLOOR_STORE_PASSWORD_FILE", "TAILFLOOR_STORE_CA_FILE", "TAILFLOOR_SESSIONS",
            "TAILFLOOR_STORE_KEY_FILE", "TAILFLOOR_STORE_PREVIOUS_KEY_FILE"} <= found
    assert "TAILFLOOR_SOME_NAME" not in found  # the settings docstring's example


def test_every_variable_is_documented_with_its_flag() -> None:
    text = CONFIGURATION.read_text()
    variables = serve_variables()
    assert len(variables) >= len(options(commands()["tailfloor serve"])) - 1
    rows = [line for line in text.splitlines() if line.startswith("| `--")]
    for flag, variable in variables.items():
        row = [r for r in rows if flag in documented_flags(r.split("|")[1])]
        assert row and variable in row[0], f"{flag}: its row does not name {variable}"
    documented = set(ENV.findall(text))
    known = code_variables() | set(variables.values())
    assert sorted(known - documented) == []
    assert sorted(documented - known) == []


def test_every_variable_named_in_the_docs_exists() -> None:
    from tests.deploy.tools import INSTALL_HINTS

    sources = "\n".join(p.read_text() for folder in ("proxy", "tests", "helm", ".ci")
                        for p in (ROOT / folder).rglob("*")
                        if p.is_file() and p.suffix in (".py", ".yaml", ".tpl", "")
                        and "fixtures" not in p.parts and p != Path(__file__))
    known = set(ENV.findall(sources)) | code_variables() | set(serve_variables().values())
    # the deployment tests' tool overrides: find_tool reads TAILFLOOR_<NAME> for each tool
    known |= {"TAILFLOOR_" + n.upper().replace("-", "_") for n in INSTALL_HINTS}
    for page in PAGES:
        for name in sorted(set(ENV.findall(page.read_text()))):
            assert name in known, f"{page.name} names {name}, which nothing reads"


# ---------------------------------------------------------------- metrics

def exported() -> dict[str, tuple[str, set[str]]]:
    """name as scraped -> (type, labels) for every series a fresh Metrics registers."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    wrappers = [w for w in vars(metrics).values() if isinstance(w, MetricWrapperBase)]
    out = {}
    for wrapper in wrappers:
        family = wrapper.describe()[0]
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = (family.type, set(wrapper._labelnames))
    families = {f.name for f in registry.collect()}
    assert families == {w.describe()[0].name for w in wrappers}, "a metric outside Metrics' fields"
    return out


def documented_metrics() -> dict[str, tuple[str, set[str]]]:
    text = (DOCS / "observability.md").read_text()
    table = text.split("<!-- metrics:begin -->")[1].split("<!-- metrics:end -->")[0]
    out = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].startswith("`tailfloor_"):
            labels = {x.strip() for x in cells[2].split(",") if x.strip()}
            out[cells[0].strip("`")] = (cells[1], labels)
    return out


def test_every_exported_metric_is_documented_with_its_type_and_labels() -> None:
    series = exported()
    assert len(series) > 30 and series["tailfloor_requests_total"] == \
        ("counter", {"route", "model", "code"})
    documented = documented_metrics()
    assert sorted(set(series) - set(documented)) == [], "undocumented metrics"
    assert sorted(set(documented) - set(series)) == [], "documented metrics not exported"
    wrong = {n: (documented[n], series[n]) for n in series if documented[n] != series[n]}
    assert wrong == {}


# ---------------------------------------------------------------- agent snippets

def included() -> list[tuple[Path, Path, str]]:
    """(page, snippet file, the fenced block after its marker) for every inclusion."""
    out = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            match = SNIPPET.match(line)
            if match:
                assert FENCE.match(lines[i + 1]), f"{page.name}:{i + 1}: no code block"
                end = next(j for j in range(i + 2, len(lines)) if FENCE.match(lines[j]))
                out.append((page, page.parent / match.group(1),
                            "\n".join(lines[i + 2:end]) + "\n"))
    return out


def snippet(name: str) -> object:
    return json.loads((SNIPPETS / name).read_text())


def test_snippets_are_shown_verbatim_and_every_one_is_shown() -> None:
    shown = included()
    for page, path, block in shown:
        assert path.exists(), f"{page.name} includes {path}, which is missing"
        assert block == path.read_text(), f"{page.name} shows {path.name} not as it is"
    assert {p.resolve() for _, p, _ in shown} == {p.resolve() for p in SNIPPETS.iterdir()}
    for page in PAGES:  # every JSON block of the docs parses
        for block in re.findall(r"^```json\n(.*?)^```", page.read_text(), re.S | re.M):
            json.loads(block)


def shape(value: object) -> object:
    """A value's keys and types, without its values (a list by its first item)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def within(small: object, large: object, where: str = "") -> list[str]:
    """What ``small``'s shape has that ``large``'s has not."""
    if isinstance(small, dict) and isinstance(large, dict):
        return [p for k, v in small.items()
                for p in (within(v, large[k], f"{where}.{k}") if k in large
                          else [f"{where}.{k}: missing"])]
    if isinstance(small, list) and isinstance(large, list):
        return within(small[0], large[0], where + "[]") if small and large else []
    return [] if small == large else [f"{where}: {small} is {large} in the live tests"]


def only(mapping: object) -> object:
    assert isinstance(mapping, dict) and len(mapping) == 1
    return next(iter(mapping.values()))


def test_the_pi_snippet_is_what_the_live_pi_tests_write(tmp_path: Path) -> None:
    from tests.agents.pi_agent import PiAgent

    shown = snippet("pi-models.json")
    assert isinstance(shown, dict)
    provider = only(shown["providers"])
    assert isinstance(provider, dict)
    live = json.loads(PiAgent(tmp_path, provider["baseUrl"], affinity_headers=True)
                      .agent_dir.joinpath("models.json").read_text())
    live_provider = only(live["providers"])
    assert set(shown) == set(live) and set(provider) == set(live_provider)
    assert within(shape(shown), {"providers": {k: shape(live_provider)
                                               for k in shown["providers"]}}) == []
    assert provider["api"] == live_provider["api"]
    # the live tests give Pi tailfloor's URL + "/v1"
    assert urlsplit(provider["baseUrl"]).path.endswith("/v1")
    readme = (ROOT / "README.md").read_text()
    # the affinity headers the README names are those the live tests turn on
    assert '`"compat": {"sendSessionAffinityHeaders": true}`' in readme
    assert live_provider["models"][0]["compat"] == {"sendSessionAffinityHeaders": True}


def test_the_openclaw_snippet_is_what_the_live_gateway_tests_write(tmp_path: Path) -> None:
    from tests.agents.openclaw_agent import Agent, base_url, config

    shown = snippet("openclaw-provider.json")
    assert isinstance(shown, dict)
    provider = only(shown["models"]["providers"])
    assert isinstance(provider, dict)
    proxy_url = provider["baseUrl"].split("/agents/")[0]
    agent = provider["baseUrl"].split("/agents/")[1].split("/")[0]
    live = config(18789, proxy_url, tmp_path, [Agent(agent)], api=provider["api"])
    live_provider = only(live["models"]["providers"])
    assert set(provider) == set(live_provider)
    providers = {k: shape(live_provider) for k in shown["models"]["providers"]}
    assert within(shape(shown), {"models": {"providers": providers}}) == []
    assert provider["baseUrl"] == live_provider["baseUrl"] == \
        base_url(provider["api"], proxy_url, agent)


def test_the_pi_dialect_snippet_is_what_the_live_dialect_tests_write() -> None:
    from tests.agents.pi_dialects import base_url, models_json

    shown = snippet("pi-models-dialects.json")
    assert isinstance(shown, dict)
    apis = set()
    for provider in shown["providers"].values():
        api = provider["api"]
        apis.add(api)
        model = provider["models"][0]
        live = only(models_json(api, provider["baseUrl"], compat=model.get("compat"))["providers"])
        assert isinstance(live, dict)
        assert set(provider) == set(live)
        assert within(shape(provider), shape(live)) == []
        assert provider["baseUrl"] == base_url(api, provider["baseUrl"])
    assert apis == {"openai-responses", "anthropic-messages"}


def test_the_openai_sdk_snippet_builds_a_client_for_the_default_listener(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    client = runpy.run_path(str(SNIPPETS / "openai-sdk.py"))["client"]
    assert str(client.base_url).rstrip("/") == f"http://{settings.DEFAULT_LISTEN}/v1"
