"""Smoke check of the llama.cpp build: load a model and decode a few tokens in a child process.

`scripts/setup` ends with `python -m skippy.runtime.smoke`. The check runs in a child so that a build
that crashes (e.g. llama.cpp's AMX backend on Q4_K weights, a SIGSEGV) becomes one clear message and
a nonzero exit instead of a venv that segfaults at the first request.
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import subprocess
import sys
from pathlib import Path

CHILD_TIMEOUT_S = 300.0
PROMPT = b"The capital of France is"


def decode_greedy(model_path: Path, n_tokens: int) -> str:
    """Plain llama.cpp with its default model params (extra buffer types on, as a user's build runs)."""
    import llama_cpp as L
    import numpy as np

    from skippy.runtime.llama_backend import init_backend

    init_backend()
    model = L.llama_model_load_from_file(str(model_path).encode(), L.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {model_path}")
    vocab = L.llama_model_get_vocab(model)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch = 128, 128
    ctx = L.llama_init_from_model(model, cp)
    tokens = (L.llama_token * 64)()
    n = L.llama_tokenize(vocab, PROMPT, len(PROMPT), tokens, 64, True, False)
    batch = L.llama_batch_get_one(tokens, n)
    pieces: list[str] = []
    for _ in range(n_tokens):
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(L.llama_vocab_n_tokens(vocab),))
        token = (L.llama_token * 1)(int(np.argmax(logits)))
        piece = (ctypes.c_char * 64)()
        size = L.llama_token_to_piece(vocab, token[0], piece, 64, 0, False)
        pieces.append(bytes(piece)[: max(size, 0)].decode("utf-8", "replace"))
        batch = L.llama_batch_get_one(token, 1)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return "".join(pieces)


def run_child(model: str, n_tokens: int) -> int:
    import llama_cpp as L

    from skippy.runtime.models import resolve_model_path

    path = resolve_model_path(model)
    text = decode_greedy(path, n_tokens)
    info = L.llama_print_system_info().decode()
    print(f"smoke: {path.name}: {PROMPT.decode()!r} -> {text!r}")
    print(f"smoke: llama.cpp system info: {info.strip()}")
    from skippy.runtime.capture import native_capture_library

    library = native_capture_library()  # built here once, so no stage compiles it at startup
    print(f"smoke: stage eval callback: {f'native ({library})' if library else 'python (no C compiler found)'}")
    return 0


def check(model: str = "default", n_tokens: int = 4, timeout_s: float = CHILD_TIMEOUT_S) -> tuple[bool, str]:
    """Run the decode in a child; (ok, one-line verdict)."""
    cmd = [sys.executable, "-m", "skippy.runtime.smoke", "--child", "--model", model, "--tokens", str(n_tokens)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"smoke check: decoding {n_tokens} tokens did not finish within {timeout_s:.0f} s"
    if proc.returncode == 0:
        return True, proc.stdout.strip()
    detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return False, f"smoke check: llama.cpp crashed with {name} while decoding ({detail})"
    return False, f"smoke check: failed with exit code {proc.returncode}: {detail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m skippy.runtime.smoke", description=__doc__)
    parser.add_argument("--model", default="default", help="GGUF path or a packaged model (default: qwen2.5-coder-0.5b)")
    parser.add_argument("--tokens", type=int, default=4, help="greedy tokens to decode")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return run_child(args.model, args.tokens)
    ok, verdict = check(args.model, args.tokens)
    print(verdict, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
