"""``--store``: the URL read, the password kept out of every printed form, the backoff; and
no Redis client loaded without it."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.replicas.config import parse_store_url
from proxy.replicas.health import StoreHealth
from proxy.settings import Settings, SettingsError, add_arguments, from_namespace

SECRET = "s3cret-Pa55word"


def settings(*argv: str, env: dict[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_namespace(parser.parse_args(list(argv)), env or {})


def test_a_plain_url() -> None:
    url = parse_store_url("redis://cache.internal:6380/2")
    assert (url.host, url.port, url.db, url.tls, url.password) == ("cache.internal", 6380, 2,
                                                                   False, None)
    assert str(url) == "redis://cache.internal:6380/2"


def test_defaults_and_tls() -> None:
    url = parse_store_url("rediss://cache")
    assert (url.port, url.db, url.tls) == (6379, 0, True)


def test_the_password_is_in_no_printed_form() -> None:
    url = parse_store_url(f"redis://app:{SECRET}@cache:6379/0")
    assert url.password == SECRET and url.username == "app"
    for shown in (str(url), repr(url), f"{url}", f"{url!r}"):
        assert SECRET not in shown


def test_the_password_file_wins_and_its_newline_is_dropped(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(SECRET + "\n")
    url = parse_store_url("redis://:other@cache/0", secret)
    assert url.password == SECRET


@pytest.mark.parametrize(("raw", "says"), [
    ("http://cache:6379", "redis://"),
    ("redis://:6379/0", "no host"),
    ("redis://cache:99999/0", "port"),
    ("redis://cache/zero", "database number"),
    ("redis://cache/0?ssl=1", "query"),
])
def test_bad_urls_are_refused_at_start(raw: str, says: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings("--store", raw)
    assert says in str(caught.value)


def test_a_refused_url_never_echoes_its_password(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as caught:
        settings("--store", f"redis://app:{SECRET}@cache/zero")
    assert SECRET not in str(caught.value)
    with pytest.raises(SettingsError) as caught:
        settings("--store", "redis://cache/0",
                 env={"TAILFLOOR_STORE_PASSWORD_FILE": str(tmp_path / "missing")})
    assert "password file" in str(caught.value)


def test_the_environment_names_the_store() -> None:
    parsed = settings(env={"TAILFLOOR_STORE": "redis://cache:7000/1"})
    assert str(parsed.store) == "redis://cache:7000/1"
    assert settings().store is None


def test_a_failing_store_is_left_alone_for_a_doubling_backoff() -> None:
    now = [0.0]
    health = StoreHealth(lambda: now[0], first=0.5, longest=2.0)
    assert health.usable() and not health.failing
    assert health.failed() is True  # the episode starts: logged once
    assert not health.usable()
    now[0] = 0.5
    assert health.usable()  # one try after the backoff
    assert not health.usable()  # and only one: the others go on without the store
    assert health.failed() is False  # the same episode
    now[0] = 1.4
    assert not health.usable()  # backoff doubled to 1 s
    now[0] = 1.5
    assert health.usable()
    health.failed()
    health.failed()
    now[0] = 3.4
    assert not health.usable()  # capped at 2 s: 1.5 + 2
    now[0] = 3.5
    assert health.succeeded() is True and health.usable() and not health.failing
    assert health.succeeded() is False


def test_serving_without_a_store_never_loads_the_redis_client() -> None:
    # Importing redis.asyncio took 0.15 s of every start, and a full collection during its
    # import: a proxy without --store answers its first /healthz that much sooner.
    probe = ("import sys\n"
             "from proxy.cli import main\n"
             "from proxy.server import app\n"
             "assert app.build_app and main.main\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'redis'))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "[]"
