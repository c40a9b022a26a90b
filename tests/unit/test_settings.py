"""Settings: flags over environment over defaults, and every problem reported at once."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from proxy import settings as settings_mod
from proxy.cli.main import build_parser
from proxy.upstream.pool import UpstreamTarget

ROOT = Path(__file__).resolve().parents[2]


def parse(argv: list[str], env: dict[str, str] | None = None) -> settings_mod.Settings:
    ns = build_parser().parse_args(["serve", *argv])
    return settings_mod.from_namespace(ns, env or {})


def test_defaults() -> None:
    settings = parse([])
    assert settings.listen == "127.0.0.1:8787"
    assert settings.upstream == "https://api.openai.com"
    assert settings.keepalive_interval == 15.0 and settings.shutdown_grace == 30.0
    assert settings.max_body_bytes == 32 * 1024 * 1024


def test_flags_win_over_environment(tmp_path: Path) -> None:
    env = {"TAILFLOOR_LISTEN": "0.0.0.0:9000", "TAILFLOOR_UPSTREAM": "http://env:1/v1",
           "TAILFLOOR_SESSIONS": f"{tmp_path}/a:{tmp_path}/b",
           "TAILFLOOR_INJECT_STREAM_USAGE": "false"}
    settings = parse(["--upstream", "http://flag:2/api/v1/"], env)
    assert settings.listen == "0.0.0.0:9000"
    assert settings.upstream == "http://flag:2/api/v1"
    assert settings.sessions == (tmp_path / "a", tmp_path / "b")
    assert settings.inject_stream_usage is False
    assert parse(["--sessions", "x", "--sessions", "y"], env).sessions == (Path("x"), Path("y"))


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    with pytest.raises(settings_mod.SettingsError) as info:
        parse(["--listen", "nowhere", "--upstream", "ftp://x", "--read-timeout", "-1",
               "--rules", str(tmp_path / "missing")], {"TAILFLOOR_MAX_BODY_BYTES": "lots"})
    problems = info.value.problems
    assert len(problems) == 5
    joined = "\n".join(problems)
    for fragment in ("listen", "upstream", "read-timeout", "rules", "TAILFLOOR_MAX_BODY_BYTES"):
        assert fragment in joined


def test_serve_exits_2_with_one_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--listen", "x", "--upstream", "nope"],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert result.stderr.count("  - ") == 2


def test_help_reads_well() -> None:
    parser = build_parser()
    assert "summary plus" in parser.format_help()
    serve = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = serve.choices["serve"].format_help()
    for flag in ("--listen", "--upstream", "--sessions", "--rules", "--state", "--log-format",
                 "--log-level", "TAILFLOOR_UPSTREAM"):
        assert flag in text


@pytest.mark.parametrize(("upstream", "client", "expected"), [
    ("https://api.openai.com", "/v1/chat/completions", "/v1/chat/completions"),
    ("https://api.openai.com/v1", "/v1/chat/completions", "/v1/chat/completions"),
    ("https://openrouter.ai/api/v1", "/v1/models", "/api/v1/models"),
    ("http://vllm:8000/v1", "/chat/completions", "/v1/chat/completions"),
    ("https://openrouter.ai/api/v1", "/chat/completions", "/api/v1/chat/completions"),
])
def test_upstream_path_mapping(upstream: str, client: str, expected: str) -> None:
    assert UpstreamTarget.parse(upstream).path_for(client) == expected


def test_serve_refuses_invalid_rules(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('[defaults]\nmin_tail_messages = "many"\nmode = "loud"\n')
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--listen", "127.0.0.1:0", "--rules",
         str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert "min_tail_messages" in result.stderr and "mode" in result.stderr


def test_the_inspector_settings(tmp_path: Path) -> None:
    settings = parse([])
    assert (settings.inspect_requests, settings.inspect_memory_bytes) == (20, 32 * 1024 * 1024)
    assert settings.inspect_content is False and settings.admin_token_file is None
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    settings = parse(["--inspect-requests", "5", "--inspect-content"],
                     {"TAILFLOOR_INSPECT_MEMORY_BYTES": "1000",
                      "TAILFLOOR_ADMIN_TOKEN_FILE": str(token),
                      "TAILFLOOR_INSPECT_CONTENT": "false"})
    assert (settings.inspect_requests, settings.inspect_memory_bytes) == (5, 1000)
    assert settings.inspect_content is True and settings.admin_token_file == token
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(settings_mod.SettingsError) as info:
        parse(["--inspect-requests", "-1", "--inspect-memory-bytes", "0",
               "--admin-token-file", str(tmp_path / "empty")])
    assert [p.split(":", 1)[0] for p in info.value.problems] == [
        "inspect-requests", "inspect-memory-bytes", "admin-token-file"]


def test_the_store_timeout() -> None:
    store = ["--store", "redis://127.0.0.1:6379/0"]
    found = parse(store).store
    assert found is not None and found.timeout == 0.25
    found = parse(store, {"TAILFLOOR_STORE_TIMEOUT_MS": "750"}).store
    assert found is not None and found.timeout == 0.75
    found = parse(store, {"TAILFLOOR_STORE_TIMEOUT_MS": "1000"}).store
    assert found is not None and found.timeout == 1.0
    # int() takes all of these; a setting of whole milliseconds takes plain digits only.
    for bad in ("fast", "5", "1001", "2000", "20000", "1.5", "1_000", "+250", " 250",
                "250 ", "-250", "\u0662\u0665\u0660", " "):
        with pytest.raises(settings_mod.SettingsError) as info:
            parse(store, {"TAILFLOOR_STORE_TIMEOUT_MS": bad})
        assert "TAILFLOOR_STORE_TIMEOUT_MS" in "\n".join(info.value.problems)


def test_the_floor_wait() -> None:
    assert parse([]).floor_wait_ms == 0  # no bound: every request waits for its floor
    assert parse([], {"TAILFLOOR_FLOOR_WAIT_MS": "250"}).floor_wait_ms == 250
    assert parse(["--floor-wait-ms", "0"]).floor_wait_ms == 0  # no bound
    for bad in ("-1", "600001"):
        with pytest.raises(settings_mod.SettingsError) as info:
            parse(["--floor-wait-ms", bad])
        assert "floor-wait-ms" in "\n".join(info.value.problems)
