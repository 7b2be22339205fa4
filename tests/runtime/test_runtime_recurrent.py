"""A hybrid recurrent family (tiny LFM2) across a split: what its state allows, said rather than drifted.

Its short-convolution layers keep one running state per session. llama.cpp snapshots that state for
the tokens of the last decode (n_rs_seq), so a speculative rewind inside the last window is exact
(tests/runtime/test_runtime_batching.py runs the verify-shaped windows); a rewind further back is
refused with the reason, and the prefix cache is off, saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import decode_logits, greedy_run, prompt_tokens, tiny_spec, window

from skippy.runtime.chain import LocalChain
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.stage_runtime import MAX_DRAFT_TOKENS, StageRuntime


def test_prefix_cache_is_off_and_says_why(tiny_model: Callable[..., Path], open_stage: Callable[..., StageRuntime]) -> None:
    stage = open_stage(tiny_spec(tiny_model("lfm2"), layer_end=6, lane_count=1, prefix_entries=2))
    assert stage.prefix is None
    assert stage.prefix_cache_off.startswith("prefix cache off for lfm2: its recurrent layers")
    llama = open_stage(tiny_spec(tiny_model("llama"), layer_end=6, lane_count=1, prefix_entries=2))
    assert llama.prefix is not None and llama.prefix_cache_off == ""


def test_a_rewind_inside_the_last_window_is_exact(tiny_model: Callable[..., Path],
                                                  open_chain: Callable[..., LocalChain]) -> None:
    """Decode a 6-token window, rewind 4 of it, decode on: the same logits as never having gone past."""
    chain = open_chain(tiny_spec(tiny_model("lfm2"), lane_count=1), [1, 3])
    prompt, extra, tail = prompt_tokens(20, seed=30), prompt_tokens(6, seed=31), prompt_tokens(3, seed=32)
    _, straight = greedy_run(chain, [*prompt, *extra[:2], *tail], 0)
    decode_logits(chain, [window(0, 0, prompt, "last")])
    decode_logits(chain, [window(0, 20, extra)])
    rewound = decode_logits(chain, [window(0, 22, tail)])[0]  # positions 22..25 of the 6-token window dropped
    chain.release(0)
    assert np.array_equal(rewound, straight[22:25])


def test_a_rewind_past_the_last_window_is_refused(tiny_model: Callable[..., Path],
                                                  open_chain: Callable[..., LocalChain]) -> None:
    chain = open_chain(tiny_spec(tiny_model("lfm2"), lane_count=1), [3])
    decode_logits(chain, [window(0, 0, prompt_tokens(20, seed=33), "last")])
    decode_logits(chain, [window(0, 20, [5])])
    with pytest.raises(RuntimeUsageError, match=r"lfm2 keeps recurrent state, which rewinds only to a position "
                                                r"inside the session's last window \[20, 21\)"):
        decode_logits(chain, [window(0, 15, [6])])
    chain.release(0)
    assert MAX_DRAFT_TOKENS == 16  # the snapshots kept: n_rs_seq
