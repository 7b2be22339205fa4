"""`skippy generate`: run a model's slices one after another in one process and print the completion."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from skippy.config import ConfigError
from skippy.runtime.chain import LocalChain
from skippy.runtime.models import DEFAULT_MODEL, PACKAGED
from skippy.runtime.sampling import DEFAULT_SEED, SamplingParams
from skippy.runtime.slices import stderr_progress
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.tokenizer import IncrementalDecoder, Tokenizer


def parse_split(text: str) -> list[int]:
    """'9' or '5,13' -> split points (layer indices where a new stage starts)."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--split must be comma-separated layer indices, got {text!r}") from None


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling (defaults: greedy)")
    group.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    group.add_argument("--top-k", type=int, default=0, help="0 = off")
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--min-p", type=float, default=0.0)
    group.add_argument("--presence-penalty", type=float, default=0.0)
    group.add_argument("--frequency-penalty", type=float, default=0.0)
    group.add_argument("--repeat-penalty", type=float, default=1.0)
    group.add_argument("--seed", type=int, default=DEFAULT_SEED, help="default: random")


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repeat_penalty=args.repeat_penalty,
        seed=args.seed,
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text through the model's slices in one process")
    p.add_argument("--model", default="default",
                   help=f"a packaged model ({', '.join(PACKAGED)}; default: {DEFAULT_MODEL.name}) or a GGUF path")
    p.add_argument("--split", type=parse_split, default=[], help="split points, e.g. 9 or 5,13 (none: whole model)")
    p.add_argument("--topology", type=Path, default=None,
                   help="run over this topology's stage processes (stage configs <stage_id>.json beside it); "
                        "starts them unless stage 0 already answers, and stops what it started")
    p.add_argument("--run-dir", type=Path, default=None, help="logs of started stages (default: runs/<time>)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--ctx-size", type=int, default=0,
                   help="context per session (default 0: the model's trained context, bounded by memory)")
    p.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    add_sampling_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.ctx_size < 0:
        raise ConfigError(f"--ctx-size must be >= 0 (0: the model's trained context), got {args.ctx_size}")
    if args.topology is not None:
        from skippy.cli.remote_generate import run_over_topology

        return run_over_topology(args, sampling_from_args(args))
    sampling = sampling_from_args(args)
    spec = RuntimeSpec(
        model_path=args.model, layer_start=0, layer_end=0, ctx_size=args.ctx_size, lane_count=1, n_threads=args.threads
    )
    chain = LocalChain(spec, args.split, progress=stderr_progress("writing slice"))
    try:
        tokenizer = Tokenizer(chain.stages[0].model)
        prompt = tokenizer.encode(args.prompt)
        ranges = ", ".join(f"[{s.layer_start}, {s.layer_end})" for s in chain.stages)
        print(f"stages: {ranges}; prompt: {len(prompt)} tokens", file=sys.stderr)
        decoder = IncrementalDecoder(tokenizer)
        stop = tokenizer.eog_tokens()
        start = time.perf_counter()
        n = 0
        sys.stdout.write(args.prompt)
        for token in chain.generate(prompt, args.max_tokens, sampling, stop_tokens=stop):
            n += 1
            if token in stop:
                break
            sys.stdout.write(decoder.push(token))
            sys.stdout.flush()
        sys.stdout.write(decoder.flush() + "\n")
        elapsed = time.perf_counter() - start
        print(f"generated {n} tokens in {elapsed:.2f} s ({n / max(elapsed, 1e-9):.1f} tok/s)", file=sys.stderr)
    finally:
        chain.close()
    return 0
