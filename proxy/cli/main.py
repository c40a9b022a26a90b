"""The ``tailfloor`` command line: ``serve`` and the inspection commands.

Each subcommand lives in a module exposing ``register(subparsers)``, which adds its parser and
sets ``run`` (a callable taking the parsed namespace and returning an exit code).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from proxy import __version__
from proxy.cli import demo as demo_command
from proxy.cli import doctor as doctor_command
from proxy.cli import rules as rules_command
from proxy.cli import serve as serve_command
from proxy.cli import sessions as sessions_command

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

COMMANDS: tuple[Registrar, ...] = (serve_command.register, rules_command.register,
                                   sessions_command.register, demo_command.register,
                                   doctor_command.register)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tailfloor",
        description=(
            "OpenAI-compatible streaming reverse proxy for agent runtimes. It follows the "
            "agents' session transcripts and makes every request carry a summary plus at "
            "least the last N raw messages."
        ),
    )
    parser.add_argument("--version", action="version", version=f"tailfloor {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    run = getattr(ns, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    code: int = run(ns)
    return code
