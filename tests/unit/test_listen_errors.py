"""A port in use names the listener, the flag that moves it and the fix."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT, free_port


@pytest.mark.parametrize("listener,flag,env", [("admin", "--admin-listen",
                                                "TAILFLOOR_ADMIN_LISTEN"),
                                               ("proxy", "--listen", "TAILFLOOR_LISTEN")])
def test_a_taken_port_says_which_listener_and_how_to_move_it(listener: str, flag: str,
                                                             env: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"--listen": f"127.0.0.1:{free_port()}",
                 "--admin-listen": f"127.0.0.1:{free_port()}", flag: f"127.0.0.1:{port}"}
        done = subprocess.run(
            [sys.executable, "-m", "proxy", "serve", *(x for kv in ports.items() for x in kv),
             "--upstream", "http://127.0.0.1:9",
             "--sessions", str(ROOT / "tests" / "fixtures" / "floor")],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    said = done.stdout + done.stderr
    assert done.returncode == 1
    assert (f"the {listener} listener ({flag}, {env}) cannot bind 127.0.0.1:{port}: address "
            f"in use; another tailfloor? pass {flag} 127.0.0.1:0 for a free port") in said, said
