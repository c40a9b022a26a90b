"""Instructions per chunk of the stream scanner alone (``StreamScanner.feed``), counted by
valgrind: the scanner as it is, beside the same scanner with the plain regex search over each
whole chunk (how it read chunks before ``proxy/server/sse_interest.py``), in the same run.

Each figure is the difference of two runs of this script under cachegrind, ``--streams``
streams apart, per chunk: the interpreter's start-up drops out, and no socket, timer or
other process is in it, so two runs agree to a few instructions (``instructions.py
--stream`` measures the whole relay per event, which moves by ~2k between runs).

Streams: the fake upstream's chat stream (200 pieces of 17 characters, the usage asked for,
as ``instructions.py --stream`` relays them) and its Anthropic Messages stream.

Usage: python tests/bench/scan_cost.py [--streams 20]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# The plain search, as the scanner made it per chunk before (the baseline).
PLAIN = re.compile(rb'"usage"\s*:\s*\{|"error"\s*:|"finish_reason"\s*:\s*"')
DIALECT_PLAIN = re.compile(
    rb'"usage"\s*:\s*\{|"error"\s*:|"stop_reason"\s*:\s*"|"type"\s*:\s*"error"')
KINDS = ("chat", "anthropic")


def chunks(kind: str) -> list[bytes]:
    from tests import fake_dialects
    from tests.fake_upstream import Reply, _sse_chunks
    reply = Reply(text="1733312345.123456" * 200, pieces=200)
    if kind == "chat":
        return _sse_chunks("gpt-4o", reply, True)
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return fake_dialects.events(fake_dialects.MESSAGES, payload, reply, "id1")


def scan(kind: str, plain: bool, streams: int) -> None:
    """What runs under valgrind: ``streams`` streams through a fresh scanner each."""
    from proxy.server.sse import StreamScanner
    from proxy.wire.anthropic import MESSAGES
    pieces = chunks(kind)
    for _ in range(streams):
        scanner = StreamScanner(dialect=None if kind == "chat" else MESSAGES)
        if plain:  # the pattern's own search, called as the scanner called it before
            scanner._interesting = (PLAIN if kind == "chat" else DIALECT_PLAIN).search
        for piece in pieces:
            scanner.feed(piece)


def counted(kind: str, plain: bool, streams: int, work: Path) -> int:
    out = work / f"cg-{kind}-{plain}-{streams}.out"
    subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no",
                    f"--cachegrind-out-file={out}", sys.executable, __file__, "--run", kind,
                    "plain" if plain else "now", str(streams)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONHASHSEED": "0"})
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no valgrind summary in {out.name}")


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--run":
        scan(sys.argv[2], sys.argv[3] == "plain", int(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=20)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="tailfloor-scan-"))
    print(f"instructions per chunk fed to StreamScanner ({args.streams} streams less none)")
    print(f"{'stream':<12}{'chunks':>8}{'plain search':>16}{'now':>12}{'change':>10}")
    try:
        for kind in KINDS:
            per = len(chunks(kind)) * args.streams
            plain, now = ((counted(kind, p, args.streams, work) - counted(kind, p, 0, work))
                          / per for p in (True, False))
            print(f"{kind:<12}{len(chunks(kind)):>8}{plain:>16,.0f}{now:>12,.0f}"
                  f"{now / plain - 1:>10.1%}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
