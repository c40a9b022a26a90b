"""Server settings: command-line flags with environment equivalents, validated all at once.

Every flag ``--some-name`` can also be given as ``TAILFLOOR_SOME_NAME``; the flag wins. An
invalid combination fails at start with one message that lists every problem, so an operator
fixes a broken deployment in one round trip.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from proxy.replicas.config import StoreURL, parse_store_url
from proxy.replicas.signing import read_key
from proxy.telemetry.config import TelemetryConfig, telemetry_config

DEFAULT_LISTEN = "127.0.0.1:8787"
DEFAULT_ADMIN_LISTEN = "127.0.0.1:8788"
DEFAULT_UPSTREAM = "https://api.openai.com"
ENV_PREFIX = "TAILFLOOR_"


class SettingsError(ValueError):
    """One or more settings are invalid; ``problems`` lists each one."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid settings:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass(frozen=True)
class Settings:
    listen_host: str = "127.0.0.1"
    listen_port: int = 8787
    admin_host: str = "127.0.0.1"
    admin_port: int = 8788
    upstream: str = DEFAULT_UPSTREAM
    sessions: tuple[Path, ...] = ()
    upstream_ca: Path | None = None
    rules: Path | None = None
    state: Path | None = None
    store: StoreURL | None = None
    log_format: str = "text"
    log_level: str = "INFO"
    max_body_bytes: int = 32 * 1024 * 1024
    max_buffered_bytes: int = 48 * 1024 * 1024
    idle_timeout: float = 60.0
    min_body_rate: int = 16 * 1024
    max_connections: int = 0
    connect_timeout: float = 10.0
    read_timeout: float = 600.0
    keepalive_interval: float = 15.0
    shutdown_grace: float = 30.0
    inject_stream_usage: bool = True
    tailfloor_header: str = "on"  # on | detailed | off
    introspection: bool = True
    access_log: bool = False
    label_cap: int = 64
    inspect_requests: int = 20
    inspect_memory_bytes: int = 32 * 1024 * 1024
    inspect_content: bool = False
    session_cache_bytes: int = 28 * 1024 * 1024
    floor_wait_ms: int = 0
    scan_workers: str = "auto"
    admin_token_file: Path | None = None
    health_host: str | None = None  # None: no health process (--health-listen unset)
    health_port: int = 0
    health_stale_after: float = 10.0
    replica_name: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)
    # The OTLP export the standard OTEL_* variables ask for (proxy/telemetry/config.py)
    telemetry: TelemetryConfig | None = None

    @property
    def listen(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    @property
    def admin_listen(self) -> str:
        return f"{self.admin_host}:{self.admin_port}"

    @property
    def health_listen(self) -> str:
        return f"{self.health_host}:{self.health_port}" if self.health_host else ""


_HEADER_MODES = ("on", "detailed", "off")
_MILLIS = re.compile(r"[0-9]{1,9}")  # re's [0-9], not str.isdigit: no other script's digits
_STORE_TIMEOUT_MAX_MS = 1000  # see _store_timeout

# name, type, default, help. The flag is --name with '_' -> '-'; the variable TAILFLOOR_NAME.
_OPTIONS: tuple[tuple[str, str, object, str], ...] = (
    ("listen", "str", DEFAULT_LISTEN, "HOST:PORT to listen on"),
    ("admin_listen", "str", DEFAULT_ADMIN_LISTEN,
     "HOST:PORT of the admin listener (/metrics, /healthz, /readyz, /tailfloor/*; 0 = any "
     "free port)"),
    ("upstream", "str", DEFAULT_UPSTREAM,
     "model API base URL; a path such as /v1 or /api/v1 is kept (see docs/http.md)"),
    ("upstream_ca", "path", None,
     "PEM file of CA certificates to trust for an https upstream (default: the system's)"),
    ("rules", "path", None, "directory of policy files (TOML), hot-reloaded"),
    ("state", "path", None, "directory for tailfloor's own state (compaction store)"),
    ("store", "str", None,
     "shared store for several replicas: redis://host:port/db or rediss:// (TLS); a "
     "password from the URL or the file named by TAILFLOOR_STORE_PASSWORD_FILE"),
    ("log_format", "choice:json,text", "text", "log line format"),
    ("log_level", "choice:DEBUG,INFO,WARNING,ERROR", "INFO", "log level"),
    ("max_body_bytes", "int", 32 * 1024 * 1024, "largest request body accepted (413 above)"),
    ("max_buffered_bytes", "int", 48 * 1024 * 1024,
     "memory chat request bodies take at once (their bytes and their parsed forms, "
     "estimated), all requests together (503 busy above)"),
    ("idle_timeout", "float", 60.0,
     "seconds a client connection may wait for its next request head (also the deadline for "
     "a slow head) before it is closed"),
    ("min_body_rate", "int", 16 * 1024,
     "bytes/s a chat request body must arrive at, after a start of idle-timeout seconds "
     "(408 when slower)"),
    ("max_connections", "int", 0,
     "client connections at once, 503 beyond (0: from the open-file limit)"),
    ("connect_timeout", "float", 10.0, "seconds to connect to the upstream (504 after)"),
    ("read_timeout", "float", 600.0,
     "seconds the upstream may stay silent before the answer or between stream chunks"),
    ("keepalive_interval", "float", 15.0,
     "seconds of stream idleness before an SSE comment keep-alive (0 disables)"),
    ("shutdown_grace", "float", 30.0, "seconds in-flight requests may finish after SIGTERM"),
    ("inject_stream_usage", "bool", True,
     "ask streaming upstreams for usage even when the client did not, and hide it again"),
    ("tailfloor_header", "header", "on",
     "the x-tailfloor response header: on (what was done, without the reasons that tell a "
     "client whether its text matched a session), detailed (with them) or off"),
    ("introspection", "bool", True,
     "serve /tailfloor/sessions (session ids, keys, paths) on the admin listener (the "
     "inspector's /tailfloor/ui has its own switch: --inspect-requests 0)"),
    ("access_log", "bool", False,
     "log one line per request at INFO (costs ~40 us per request; metrics cover the counts)"),
    ("label_cap", "int", 64, "distinct model/agent label values before 'other'"),
    ("inspect_requests", "int", 20,
     "requests kept per session for the inspector pages on the admin listener (0: off)"),
    ("inspect_memory_bytes", "int", 32 * 1024 * 1024,
     "memory the inspector's kept requests may use, all sessions together"),
    ("inspect_content", "bool", False,
     "let the inspector show message text (off: roles, sizes, tool names and hashes only)"),
    ("session_cache_bytes", "int", 28 * 1024 * 1024,
     "memory for what an agent's next request reuses (kept renderings of restored messages, "
     "unpacked sessions): raise it with many agents at work at once"),
    ("floor_wait_ms", "int", 0,
     "milliseconds a request waits for its floor decision to start (transcript reads, one "
     "at a time) before it goes upstream as it came, marked reason=busy (0: no bound)"),
    ("scan_workers", "choice:auto,0,1,2,3,4", "auto",
     "processes that read the transcripts at start beside this one (0: none; auto: one a "
     "usable CPU, up to 4, from 2 CPUs and 2,000 transcript files)"),
    ("admin_token_file", "path", None,
     "file holding a token every admin route but /healthz and /readyz asks for (Bearer)"),
    ("health_listen", "str", "",
     "HOST:PORT where a small process of its own answers /healthz and /readyz, asking the "
     "event loop without waiting on it, in milliseconds even while the proxy is busy "
     "(empty: off)"),
    ("health_stale_after", "float", 10.0,
     "seconds the event loop may leave that process's question unanswered before its /healthz "
     "and /readyz answer 503"),
    ("replica_name", "str", "",
     "this replica's name on the inspector pages (default: the host name)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the serve flags. Defaults are None so the environment can fill the gaps."""
    for name, kind, default, help_text in _OPTIONS:
        flag = "--" + name.replace("_", "-")
        env = ENV_PREFIX + name.upper()
        shown = f"{help_text} (env {env}; default {default})"
        if kind == "bool":
            parser.add_argument(flag, dest=name, default=None,
                                action=argparse.BooleanOptionalAction, help=shown)
        elif kind == "header":
            parser.add_argument(flag, dest=name, default=None, nargs="?", const="on",
                                choices=_HEADER_MODES, metavar="on|detailed|off", help=shown)
            parser.add_argument("--no-" + flag[2:], dest=name, action="store_const",
                                const="off", help=f"the same as {flag} off")
        else:
            choices = kind.split(":", 1)[1].split(",") if kind.startswith("choice:") else None
            parser.add_argument(flag, dest=name, default=None, metavar=name.upper(),
                                choices=choices, help=shown)
    parser.add_argument(
        "--sessions", dest="sessions", action="append", default=None, metavar="PATH",
        help="transcript root to follow; repeatable (env TAILFLOOR_SESSIONS, "
             f"'{os.pathsep}'-separated; default: the usual OpenClaw and Pi locations)")


def _as_bool(raw: str) -> bool | None:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    return None


def from_namespace(ns: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Merge flags over environment over defaults; raise SettingsError listing every problem."""
    problems: list[str] = []
    values: dict[str, object] = {}
    for name, kind, default, _help in _OPTIONS:
        env = ENV_PREFIX + name.upper()
        raw: object = getattr(ns, name, None)
        source = "--" + name.replace("_", "-")
        if raw is None and env in environ:
            raw, source = environ[env], env
        if raw is None:
            values[name] = default
            continue
        values[name] = _convert(name, kind, raw, source, problems)

    sessions_raw: list[str] = list(getattr(ns, "sessions", None) or [])
    if not sessions_raw and environ.get(ENV_PREFIX + "SESSIONS"):
        sessions_raw = [p for p in environ[ENV_PREFIX + "SESSIONS"].split(os.pathsep) if p]

    host, port = _parse_listen(str(values.pop("listen")), problems)
    admin_host, admin_port = _parse_listen(str(values.pop("admin_listen")), problems,
                                           "admin-listen")
    if (admin_host, admin_port) == (host, port) and port != 0:
        problems.append("admin-listen: must differ from listen")
    health_host, health_port = _health_listen(str(values.pop("health_listen")), problems,
                                              ((host, port), (admin_host, admin_port)))
    upstream = str(values["upstream"]).rstrip("/")
    parts = urlsplit(upstream)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        problems.append(f"upstream: {upstream!r} is not an http(s) URL with a host")
    elif parts.query or parts.fragment:
        problems.append(f"upstream: {upstream!r} must not carry a query or fragment")
    for name in ("max_body_bytes", "max_buffered_bytes", "label_cap", "session_cache_bytes"):
        number = values[name]
        if isinstance(number, int) and number <= 0:
            problems.append(f"{name.replace('_', '-')}: must be positive, got {number}")
    _check_bounds(values, problems)
    _check_inspector(values, problems)
    if isinstance(values["min_body_rate"], int) and values["min_body_rate"] <= 0:
        problems.append(f"min-body-rate: must be positive, got {values['min_body_rate']}")
    for name in ("connect_timeout", "read_timeout", "shutdown_grace", "idle_timeout",
                 "health_stale_after"):
        number = values[name]
        if isinstance(number, float) and number <= 0:
            problems.append(f"{name.replace('_', '-')}: must be positive, got {number}")
    interval = values["keepalive_interval"]
    if isinstance(interval, float) and interval < 0:
        problems.append(f"keepalive-interval: must be >= 0, got {interval}")
    ca_file = values["upstream_ca"]
    if isinstance(ca_file, Path) and not ca_file.is_file():
        problems.append(f"upstream-ca: {str(ca_file)!r} is not a file")
    rules = values["rules"]
    if isinstance(rules, Path) and not rules.is_dir():
        problems.append(f"rules: {str(rules)!r} is not a directory")
    store = _store(values.pop("store"), environ, problems)
    if problems:
        raise SettingsError(problems)
    values["upstream"] = upstream
    return Settings(
        listen_host=host, listen_port=port, admin_host=admin_host, admin_port=admin_port,
        health_host=health_host, health_port=health_port,
        sessions=tuple(Path(p).expanduser() for p in sessions_raw), store=store,
        telemetry=telemetry_config(environ),
        **values,  # type: ignore[arg-type]
    )


def _health_listen(raw: str, problems: list[str], taken: tuple[tuple[str, int], ...]
                   ) -> tuple[str | None, int]:
    if not raw.strip():
        return None, 0
    host, port = _parse_listen(raw.strip(), problems, "health-listen")
    if port != 0 and (host, port) in taken:
        problems.append("health-listen: must differ from listen and admin-listen")
    return host, port


def _check_bounds(values: Mapping[str, object], problems: list[str]) -> None:
    cache = values["session_cache_bytes"]
    if isinstance(cache, int) and cache > 1 << 40:
        problems.append(f"session-cache-bytes: at most 1 TiB, got {cache}")
    wait = values["floor_wait_ms"]
    if isinstance(wait, int) and not 0 <= wait <= 600_000:
        problems.append(f"floor-wait-ms: from 0 to 600000, got {wait}")
    if isinstance(values["max_connections"], int) and values["max_connections"] < 0:
        problems.append(f"max-connections: must be >= 0, got {values['max_connections']}")


def _check_inspector(values: Mapping[str, object], problems: list[str]) -> None:
    kept, budget = values["inspect_requests"], values["inspect_memory_bytes"]
    if isinstance(kept, int) and kept < 0:
        problems.append(f"inspect-requests: must be >= 0, got {kept}")
    if isinstance(budget, int) and budget <= 0:
        problems.append(f"inspect-memory-bytes: must be positive, got {budget}")
    token_file = values["admin_token_file"]
    if isinstance(token_file, Path) and not _has_token(token_file):
        problems.append(f"admin-token-file: {str(token_file)!r} is not a readable file "
                        "holding a token")


def _has_token(path: Path) -> bool:
    try:
        return bool(path.read_text(encoding="utf-8", errors="replace").strip())
    except OSError:
        return False


def _store(raw: object, environ: Mapping[str, str], problems: list[str]) -> StoreURL | None:
    if not raw:
        return None
    password_file = environ.get(ENV_PREFIX + "STORE_PASSWORD_FILE")
    ca_file = environ.get(ENV_PREFIX + "STORE_CA_FILE")
    key_files = [environ.get(ENV_PREFIX + name) for name in ("STORE_KEY_FILE",
                                                              "STORE_PREVIOUS_KEY_FILE")]
    try:
        url = parse_store_url(str(raw), Path(password_file) if password_file else None,
                              Path(ca_file) if ca_file else None)
        if key_files[1] and not key_files[0]:
            raise ValueError("TAILFLOOR_STORE_PREVIOUS_KEY_FILE needs TAILFLOOR_STORE_KEY_FILE")
        keys = tuple(read_key(Path(f)) for f in key_files if f)
        return dataclasses.replace(url, keys=keys, timeout=_store_timeout(
            environ.get(ENV_PREFIX + "STORE_TIMEOUT_MS")))
    except ValueError as exc:
        problems.append(f"store: {exc}")
        return None


def _store_timeout(raw: str | None) -> float:
    """TAILFLOOR_STORE_TIMEOUT_MS as seconds (default 0.25); ValueError when unusable.

    Plain ASCII digits only: int() would take ``1_000``, ``+250`` or `` 250`` too. At most
    1000: the shared lock (proxy/replicas/lock.py) expires 10 s after its last extend, the
    holder extends it a third of that later, and an extend is one call of up to four round
    trips, so 3.3 s + 4 round trips must stay short of 10 s with room to spare (7.3 s at
    1000 ms; at 2000 ms a slow store would let the lock lapse under its holder)."""
    if raw is None or raw == "":
        return 0.25
    if not _MILLIS.fullmatch(raw):
        raise ValueError(f"TAILFLOOR_STORE_TIMEOUT_MS must be whole milliseconds (digits "
                         f"only), not {raw!r}")
    millis = int(raw)
    if not 10 <= millis <= _STORE_TIMEOUT_MAX_MS:
        raise ValueError(f"TAILFLOOR_STORE_TIMEOUT_MS must be 10 to {_STORE_TIMEOUT_MAX_MS}, "
                         f"not {millis}")
    return millis / 1000


def _convert(name: str, kind: str, raw: object, source: str, problems: list[str]) -> object:
    text = str(raw)
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            problems.append(f"{source}: {text!r} is not a whole number")
            return None
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            problems.append(f"{source}: {text!r} is not a number")
            return None
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        parsed = _as_bool(text)
        if parsed is None:
            problems.append(f"{source}: {text!r} is not a boolean (true/false)")
            return False
        return parsed
    if kind == "header":
        lowered = text.strip().lower()
        flag = _as_bool(lowered) if lowered not in _HEADER_MODES else None
        if flag is not None:  # true/false, as when the option was a switch
            return "on" if flag else "off"
        if lowered not in _HEADER_MODES:
            problems.append(f"{source}: {text!r} is not one of {', '.join(_HEADER_MODES)}")
            return "on"
        return lowered
    if kind == "path":
        return Path(text).expanduser()
    if kind.startswith("choice:"):
        choices = kind.split(":", 1)[1].split(",")
        normalised = text.upper() if name == "log_level" else text.lower()
        if normalised not in choices:
            problems.append(f"{source}: {text!r} is not one of {', '.join(choices)}")
        return normalised
    return text


def _parse_listen(raw: str, problems: list[str], name: str = "listen") -> tuple[str, int]:
    host, sep, port_text = raw.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        problems.append(f"{name}: {raw!r} is not HOST:PORT with a port from 0 to 65535")
        return "127.0.0.1", 0
    return host.strip("[]") or "0.0.0.0", int(port_text)
