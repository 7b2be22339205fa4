"""The memory model's parts, and a stage's refusal when its prediction exceeds its memory limit.

Synthetic facts check what each kind of stage holds (the first the embedding rows it gathers, the final
the head, a middle one neither; a non-final one the stop block's KV); a tiny GGUF checks the facts read
from a file and the refusal that `skippy stage` runs before loading, with the limit a namespace host's
cgroup prefix passes in $SKIPPY_MEMORY_LIMIT_BYTES.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from plan_helpers import facts

from skippy.config.errors import ConfigError
from skippy.netns.cgroups import LIMIT_ENV, join_prefix, own_memory_limit
from skippy.plan.memory import MIB, ServingShape, kv_scale, read_model_facts, refuse_if_too_big, stage_memory


def test_each_stage_holds_only_what_it_uses() -> None:
    f = facts(head_mib=100)
    shape = ServingShape(lane_count=2, ctx_size=128, prefix_cache=False)
    first, middle, final = stage_memory(f, 0, 4, shape), stage_memory(f, 4, 8, shape), stage_memory(f, 8, 12, shape)
    layers = 4 * 10 * MIB
    assert middle.weights == layers  # no embedding, no head (and nothing of the stop block repacked)
    assert first.weights == layers + 2 * 128 * 4096  # one page per distinct token of 2 lanes x 128
    assert final.weights == layers + 100 * MIB + 4096  # the head and the output norm
    assert middle.kv == 256 * 5 * 2048 and final.kv == 256 * 4 * 2048  # a non-final stage's stop block has KV
    assert first.total > first.weights + first.kv + first.compute + first.process  # headroom


def test_kv_scale_follows_the_cache_types() -> None:
    assert kv_scale("f16", "f16") == 1.0
    assert kv_scale("q8_0", "q8_0") == pytest.approx(34 / 32 / 2)


def test_facts_from_a_gguf_and_the_refusal(tiny_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("llama", n_layer=6)
    f = read_model_facts(model)
    assert f.n_layer == 6 and f.head_bytes > 0 and len(f.kv_bytes_f16) == 6 and f.n_vocab > 0
    assert sum(f.layer_bytes) + f.embed_bytes <= f.file_bytes
    shape = ServingShape(2, 128, False)
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    unlimited = own_memory_limit()
    if unlimited is None or unlimited > 1 << 34:
        refuse_if_too_big(model, 0, 3, shape, "stage0")  # no (small) limit: no refusal
    monkeypatch.setenv(LIMIT_ENV, str(8 * MIB))
    assert own_memory_limit() == 8 * MIB
    with pytest.raises(ConfigError, match=r"stage0 \(layers 0-3 of .*\) needs about .* allows 8 MiB"):
        refuse_if_too_big(model, 0, 3, shape, "stage0")


def test_a_host_without_a_cgroup_adds_no_prefix() -> None:
    assert join_prefix("no-such-host-h9") == []
