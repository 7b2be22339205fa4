"""The value types of one decode call: the windows a stage is asked to run and what it returns.

`SessionWindow` is a contiguous run of one session's positions inside a decode batch (the runtime's
view of `skippy.protocol.Window`, with the first stage's token ids); `DecodeResult` is a decode call's
output. They live apart from `StageRuntime` so the prefix cache, the chain, the stage worker and the
driver can use them without importing the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from skippy.protocol import PrefixRef

__all__ = ["DecodeResult", "SessionWindow"]


@dataclass(frozen=True)
class SessionWindow:
    """A contiguous run of one session's positions inside a decode batch."""

    session_id: int
    pos_start: int
    n_tokens: int
    outputs: tuple[int, ...] = ()  # offsets in [0, n_tokens) whose logits the final stage keeps
    tokens: np.ndarray | None = None  # int32[n_tokens]; first stage only
    restore: PrefixRef | None = None  # prefix cache operations, as in skippy.protocol.Window
    record: tuple[PrefixRef, ...] = ()
    evict: tuple[int, ...] = ()


@dataclass(frozen=True)
class DecodeResult:
    hidden: np.ndarray | None  # float32[n_rows, n_embd] from a non-final stage
    output_rows: list[list[int]]  # per window, the batch rows whose logits were kept (final stage)
    missed: tuple[int, ...] = ()  # sessions whose windows were dropped: a restored entry was missing
