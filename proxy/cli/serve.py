"""``tailfloor serve``: run the proxy."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from proxy import settings as settings_mod


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the proxy",
        description="Run the proxy. Every flag has an environment equivalent (TAILFLOOR_*).")
    settings_mod.add_arguments(parser)
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace) -> int:
    try:
        settings = settings_mod.from_namespace(ns, os.environ)
    except settings_mod.SettingsError as exc:
        print(f"tailfloor: {exc}", file=sys.stderr)
        return 2
    from proxy.server.run import serve

    return serve(settings)
