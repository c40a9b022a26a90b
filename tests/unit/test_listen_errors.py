"""A port in use names the listener, the flag that moves it and the fix."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.conftest import ROOT, free_port


def test_a_taken_admin_port_says_which_listener_and_how_to_move_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{free_port()}",
             "--admin-listen", f"127.0.0.1:{port}", "--upstream", "http://127.0.0.1:9",
             "--sessions", str(ROOT / "tests" / "fixtures" / "floor")],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    said = done.stdout + done.stderr
    assert (f"the admin listener (--admin-listen, TAILFLOOR_ADMIN_LISTEN) cannot bind "
            f"127.0.0.1:{port}: address in use; another tailfloor? pass --admin-listen "
            "127.0.0.1:0 for a free port") in said, said


def test_a_taken_proxy_port_too() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}",
             "--admin-listen", f"127.0.0.1:{free_port()}", "--upstream", "http://127.0.0.1:9",
             "--sessions", str(ROOT / "tests" / "fixtures" / "floor")],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "the proxy listener (--listen, TAILFLOOR_LISTEN)" in said
