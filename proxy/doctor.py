"""``tailfloor doctor``'s checks: the set-up end to end, each finding in plain words with
its fix. Each check returns its findings; the command prints them (``proxy/cli/doctor.py``).
Blocking I/O (files, sockets): a command, never the proxy's event loop.
"""

from __future__ import annotations

import itertools
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from proxy.policy.files import load_rules_dir
from proxy.policy.parse import RulesError
from proxy.settings import Settings

__all__ = ["Finding", "check_admin", "check_roots", "check_rules", "check_store",
           "check_upstream"]

_LOOK = 20_000  # files looked at per root, at most


@dataclass(frozen=True, slots=True)
class Finding:
    ok: bool
    what: str
    fix: str = ""


def check_roots(roots: list[Path], explicit: bool) -> list[Finding]:
    out = []
    total = 0
    for root in roots:
        if not root.exists():
            out.append(Finding(not explicit, f"transcript root {root}: does not exist",
                               "" if not explicit else "create it, or pass --sessions with "
                               "the directory your agent writes its sessions to"))
            continue
        pi = sum(1 for _ in itertools.islice(root.rglob("*.jsonl"), _LOOK))
        openclaw = sum(1 for _ in itertools.islice(root.rglob("*.sqlite"), _LOOK))
        total += pi + openclaw
        out.append(Finding(True, f"transcript root {root}: {pi} JSONL transcripts, "
                                 f"{openclaw} SQLite databases"))
    if total == 0:
        out.append(Finding(False, "no transcript found in any root: tailfloor can pass "
                                  "requests through but cannot restore or carry anything",
                           "point --sessions (TAILFLOOR_SESSIONS) at ~/.openclaw or "
                           "~/.pi/agent/sessions, or wherever your agent keeps them"))
    return out


def check_rules(directory: Path | None) -> list[Finding]:
    if directory is None:
        return [Finding(True, "rules: the built-in policy (no --rules)")]
    try:
        rules = load_rules_dir(directory)
    except (RulesError, OSError) as exc:
        return [Finding(False, f"rules in {directory}: {exc}",
                        f"fix the file named above; `tailfloor rules check {directory}` "
                        "shows every problem")]
    return [Finding(True, f"rules in {directory}: {len(rules.files)} files, "
                          f"{len(rules.rules)} rules")]


def check_upstream(upstream: str, timeout: float = 5.0, ca_file: Path | None = None
                   ) -> list[Finding]:
    url = upstream.rstrip("/") + ("/models" if upstream.rstrip("/").endswith("/v1")
                                  else "/v1/models")
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return [Finding(True, f"upstream {upstream}: answers (GET {url} -> "
                                  f"{response.status})")]
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return [Finding(True, f"upstream {upstream}: reachable; it asks for a key "
                                  f"({exc.code}), which each agent sends with its requests")]
        return [Finding(exc.code < 500, f"upstream {upstream}: GET {url} -> {exc.code}",
                        "" if exc.code < 500 else "the upstream fails: check it")]
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ssl.SSLError):
            return [Finding(False, f"upstream {upstream}: TLS fails ({reason})",
                            "pass --upstream-ca FILE with the CA that signed its "
                            "certificate, or check the address")]
        return [Finding(False, f"upstream {upstream}: cannot connect ({reason})",
                        "check --upstream (TAILFLOOR_UPSTREAM): is the model server "
                        "running, and is this its address?")]
    except TimeoutError:
        return [Finding(False, f"upstream {upstream}: no answer within {timeout:.0f} s",
                        "check --upstream and the network between here and it")]


def check_admin(settings: Settings, timeout: float = 2.0) -> list[Finding]:
    where = settings.admin_listen
    try:
        with urllib.request.urlopen(f"http://{where}/healthz", timeout=timeout) as response:
            return [Finding(True, f"admin listener {where}: a tailfloor answers "
                                  f"({response.status})")]
    except urllib.error.HTTPError as exc:
        return [Finding(False, f"admin listener {where}: answers {exc.code}",
                        "another program holds the port: pass --admin-listen")]
    except (urllib.error.URLError, TimeoutError, OSError):
        return [Finding(True, f"admin listener {where}: free (no tailfloor running there)")]


def check_store(settings: Settings) -> list[Finding]:
    url = settings.store
    if url is None:
        return [Finding(True, "shared store: none (each replica keeps its own)")]
    try:
        from redis import Redis
        from redis.exceptions import RedisError
    except ImportError:  # pragma: no cover - a dependency of the package
        return [Finding(False, "shared store: redis-py is not installed", "pip install .")]
    client = Redis(host=url.host, port=url.port, db=url.db, username=url.username,
                   password=url.password, ssl=url.tls, socket_timeout=2.0,
                   socket_connect_timeout=2.0,
                   ssl_ca_certs=str(url.ca_file) if url.tls and url.ca_file else None)
    try:
        client.ping()
    except RedisError as exc:
        return [Finding(False, f"shared store {url}: {type(exc).__name__}: {str(exc)[:200]}",
                        "check --store and TAILFLOOR_STORE_PASSWORD_FILE; replicas fall back "
                        "to their own memory while it fails")]
    finally:
        client.close()
    keyed = "values signed" if url.keys else "no TAILFLOOR_STORE_KEY_FILE: values unsigned"
    return [Finding(True, f"shared store {url}: answers ({keyed})")]
