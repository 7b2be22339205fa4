"""`skippy check-config`: resolve a stage's serving options from flags + config and print them.

It fails, as `skippy stage` would, on a flag whose feature is not built yet, and, when the model file
is at hand, on a layer range its family's rules refuse (skippy.runtime.families: e.g. SmolLM3 may only
be cut at multiples of 4), naming the rule."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from enum import Enum
from pathlib import Path

from skippy.config import StageConfig, add_serving_arguments, refuse_unsupported, resolve_mtp_source, resolve_serving_options
from skippy.runtime.errors import ModelError
from skippy.runtime.models import resolve_model_path
from skippy.runtime.slices import check_range, read_model_info


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


def _check_family_rules(config: StageConfig) -> str:
    """The stage's layer range against its model family's split rules (ModelError when refused)."""
    if str(config.load_mode) != "runtime-slice":
        return "not checked: an artifact slice is checked when it loads"
    try:
        path = resolve_model_path(config.model_source)
    except ModelError as exc:
        return f"not checked: {exc}"
    info = read_model_info(path)
    check_range(info, config.layer_start, config.layer_end)
    return f"ok ({info.architecture}, layers [{config.layer_start}, {config.layer_end}) of {info.n_layer})"


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
    resolved["family_rules"] = _check_family_rules(options.config)
    if options.openai is not None and options.openai.api_key is not None:
        resolved["openai"]["api_key"] = "(set)"  # never printed
    print(json.dumps(resolved, indent=2, sort_keys=True))
    return 0
