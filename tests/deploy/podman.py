"""Podman for the pod test: a containers.conf that works on CI machines, a Debian base image
built locally with mmdebstrap (no registry images needed) and cached, and the tailfloor image.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.deploy.tools import CACHE, ROOT, find_tool, run

BASE_IMAGE = "localhost/base:bookworm"
IMAGE = "localhost/tailfloor:test"
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[engine]
runtime = "runc"
"""


def environment() -> dict[str, str]:
    """The environment every podman call gets: CONTAINERS_CONF points at our settings."""
    conf = CACHE / "podman" / "containers.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def podman(*args: str, timeout: float = 300, check: bool = True) -> str:
    proc = run([find_tool("podman"), *args], timeout=timeout, check=check, env=environment())
    return proc.stdout


def image_exists(name: str) -> bool:
    proc = run([find_tool("podman"), "image", "exists", name], check=False,
               env=environment())
    return proc.returncode == 0


def ensure_base_image() -> dict[str, float]:
    """Debian bookworm with python3 and venv, as ``BASE_IMAGE``. The rootfs tarball is kept
    in .ci-cache/podman so a machine that lost its image store only re-imports it."""
    timings: dict[str, float] = {}
    if image_exists(BASE_IMAGE):
        return timings
    tarball = CACHE / "podman" / "base-bookworm.tar"
    if not tarball.exists():
        started = time.monotonic()
        partial = tarball.with_suffix(".partial.tar")
        run([find_tool("mmdebstrap"), "--variant=apt", "--include=python3,python3-venv",
             "bookworm", str(partial)], timeout=600, stdin=open(os.devnull))  # noqa: SIM115
        partial.rename(tarball)
        timings["mmdebstrap"] = time.monotonic() - started
    started = time.monotonic()
    podman("import", str(tarball), BASE_IMAGE, timeout=300)
    timings["import"] = time.monotonic() - started
    return timings


def ca_bundle() -> Path | None:
    """The CA bundle pip uses on this machine, if one is configured (TLS-intercepting
    proxies): the image build needs it to reach the package index."""
    for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(name)
        if value and Path(value).is_file():
            return Path(value)
    return None


def build_image() -> float:
    started = time.monotonic()
    args = ["build", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "-t", IMAGE, "-f",
            str(ROOT / "Dockerfile")]
    bundle = ca_bundle()
    if bundle is not None:
        args += ["-v", f"{bundle}:/run/build-ca.pem:ro", "--build-arg",
                 "PIP_CERT=/run/build-ca.pem"]
    podman(*args, str(ROOT), timeout=600)
    return time.monotonic() - started
