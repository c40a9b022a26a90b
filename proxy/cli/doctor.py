"""``tailfloor doctor``: check a set-up end to end and say what is wrong, with the fix."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from proxy import doctor
from proxy import settings as settings_mod
from proxy.transcripts.discovery import default_roots


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check the set-up: roots, rules, upstream, admin port, store",
        description="Check what `tailfloor serve` with the same flags would use: the "
                    "transcript roots and what is in them, the rules, the upstream "
                    "(GET /v1/models), the admin listener and the shared store. Exit 1 when "
                    "something is wrong.")
    settings_mod.add_arguments(parser)
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    try:
        settings = settings_mod.from_namespace(ns, os.environ)
    except settings_mod.SettingsError as exc:
        print(f"problem: {exc}", file=out)
        return 1
    explicit = bool(settings.sessions)
    roots = list(settings.sessions) if explicit else default_roots(os.environ, Path.home())
    findings = [*doctor.check_roots(roots, explicit), *doctor.check_rules(settings.rules),
                *doctor.check_upstream(settings.upstream, ca_file=settings.upstream_ca),
                *doctor.check_admin(settings), *doctor.check_store(settings)]
    for finding in findings:
        print(("ok       " if finding.ok else "problem  ") + finding.what, file=out)
        if finding.fix:
            print("         fix: " + finding.fix, file=out)
    bad = sum(not f.ok for f in findings)
    print(f"{len(findings) - bad} ok, {bad} problems", file=out)
    return 1 if bad else 0
