"""`skippy slice`: write a slice GGUF for a layer range (for stages with load_mode artifact-slice)."""

from __future__ import annotations

import argparse
from pathlib import Path

from skippy.runtime.models import resolve_model_path
from skippy.runtime.slices import read_model_info, stderr_progress, write_slice


def parse_range(text: str) -> tuple[int, int]:
    """'0:9' -> (0, 9), the half-open layer range [0, 9)."""
    try:
        start, end = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers must look like START:END (e.g. 0:9), got {text!r}") from None
    return start, end


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("slice", help="write the slice GGUF of a layer range")
    p.add_argument("--model", default="default", help="a packaged model (default: qwen2.5-coder-0.5b) or a GGUF path")
    p.add_argument("--layers", type=parse_range, required=True, help="half-open range START:END, e.g. 0:9")
    p.add_argument("--out", type=Path, required=True, help="where to write the slice")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    source = resolve_model_path(args.model)
    start, end = args.layers
    final = end == read_model_info(source).n_layer
    write_slice(source, args.out, start, end, final=final, progress=stderr_progress(f"slice {start}:{end}"))
    print(args.out)
    return 0
