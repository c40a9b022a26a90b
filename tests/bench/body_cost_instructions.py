"""Instructions per ``body_cost`` call on ``AGENT_BODY``, counted by valgrind's cachegrind.

Each case runs in a fresh interpreter under cachegrind twice, with ``--calls`` calls and with
none; the difference per call leaves start-up out (deterministic within well under 1%).

- ``whole``: the body counted whole (no bodies kept: how every body was counted before
  ``server/body_prefixes.py``);
- ``first``: a body seen for the first time (its counts kept per block);
- ``again``: the same body sent again;
- ``appended``: each call's body the last one with a new message appended (an agent's turn).

Needs valgrind. Usage: python tests/bench/body_cost_instructions.py [--calls 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CASE = r'''
import sys
from proxy.server.body_cost import body_cost
from proxy.server.body_prefixes import RecentBodies
from tests.bench.loadgen import AGENT_BODY
case, calls, made = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
recent = RecentBodies()
# Made in both runs (copies of the body): only the calls differ.
bodies = [AGENT_BODY[:-2] + b',{"role":"user","content":"turn %d, more words"}]}' % i
          for i in range(made if case == "appended" else 0)]
for i in range(calls):
    if case == "whole":
        body_cost(AGENT_BODY, dialect=False)
    elif case == "first":
        body_cost(AGENT_BODY, dialect=False, recent=RecentBodies())
    elif case == "again":
        body_cost(AGENT_BODY, dialect=False, recent=recent)
    else:
        body_cost(bodies[i], dialect=False, recent=recent)
'''
CASES = ("whole", "first", "again", "appended")


def instructions(case: str, calls: int, made: int, work: Path) -> int:
    out = work / f"{case}-{calls}.out"
    subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no",
                    f"--cachegrind-out-file={out}", sys.executable, "-c", CASE, case,
                    str(calls), str(made)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"})
    for line in out.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"no cachegrind summary in {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="tailfloor-body-cost-"))
    print(f"instructions per body_cost call on AGENT_BODY ({args.calls} calls less none)")
    for case in CASES:
        per_call = (instructions(case, args.calls, args.calls, work)
                    - instructions(case, 0, args.calls, work)) / args.calls
        print(f"{case:<10}{per_call:>12,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
