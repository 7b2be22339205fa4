"""`skippy check-config`: resolve a stage's serving options from flags + config and print them.

It fails, as `skippy stage` would, on a flag whose feature is not built yet."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from enum import Enum
from pathlib import Path

from skippy.config import add_serving_arguments, refuse_unsupported, resolve_mtp_source, resolve_serving_options


def _plain(value: object) -> object:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-config", help="validate a stage config and serving flags; print the resolved options")
    add_serving_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    options = resolve_serving_options(args)
    refuse_unsupported(options)
    resolved = _plain(asdict(options))
    assert isinstance(resolved, dict)
    resolved["mtp_source"] = resolve_mtp_source(options).name.lower()
    if options.openai is not None and options.openai.api_key is not None:
        resolved["openai"]["api_key"] = "(set)"  # never printed
    print(json.dumps(resolved, indent=2, sort_keys=True))
    return 0
