"""The model server's OpenMP threads wait without spinning unless the user says otherwise.

llama.cpp's threads meet at a barrier after every step; OpenMP's default spins there
(300,000 turns), which beside a busy neighbour holds a core the other thread waits for
(docs/local-model.md). ``proxy.localmodel`` sets ``OMP_WAIT_POLICY=PASSIVE`` before libgomp
loads. The oracle is libgomp itself: with ``OMP_DISPLAY_ENV=VERBOSE`` it prints, as it
starts, the settings it took, ``GOMP_SPINCOUNT`` among them."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import pytest

from proxy.demo.processes import stop_process
from tests.conftest import ROOT, free_port

DISPLAY_END = "OPENMP DISPLAY ENVIRONMENT END"


def openmp_settings(extra_env: dict[str, str]) -> dict[str, str]:
    """What libgomp printed it took, in the model server started as tests/model starts it
    (stopped as soon as libgomp has spoken: the model is not needed)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OMP_",
                                                                                 "GOMP_"))}
    env.update({"OMP_DISPLAY_ENV": "VERBOSE", **extra_env})
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "model_server.py"), "--port", str(free_port())],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    pending = b""
    try:
        # Read as it comes, never past the deadline (a libgomp that prints nothing must
        # fail the test, not hang it).
        while not any(DISPLAY_END in line for line in lines):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([proc.stderr], [], [], left)[0]:
                break
            piece = os.read(proc.stderr.fileno(), 65536)
            if not piece:
                break
            pending += piece
            *complete, pending = pending.split(b"\n")
            lines.extend(line.decode(errors="replace") for line in complete)
    finally:
        stop_process(proc)
    assert any(DISPLAY_END in line for line in lines), "".join(lines[-20:])
    settings = {}
    for line in lines:
        name, sep, value = line.strip().partition(" = ")
        if sep:
            settings[name.split()[-1]] = value.strip("'")
    return settings


def test_the_threads_wait_passively_by_default() -> None:
    settings = openmp_settings({})
    assert settings["OMP_WAIT_POLICY"] == "PASSIVE"
    assert settings["GOMP_SPINCOUNT"] == "0"


@pytest.mark.parametrize("policy", ["ACTIVE", "PASSIVE"])
def test_a_policy_the_user_set_is_kept(policy: str) -> None:
    settings = openmp_settings({"OMP_WAIT_POLICY": policy})
    assert settings["OMP_WAIT_POLICY"] == policy
    assert (settings["GOMP_SPINCOUNT"] == "0") == (policy == "PASSIVE")
