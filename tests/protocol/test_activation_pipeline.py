"""A real 2-stage pipeline with `--activation-wire-dtype` sends its activations in that dtype.

Both stages run as processes (ipc endpoints, one llama.cpp thread each); stage 0's downstream link
packs the activations. Greedy tokens over the pipeline must equal, token for token, the in-process
split whose boundary goes through the codec in the same dtype (`wire_split.WireSplit`) — the same
batches, so any other dtype on the wire would show. For f32 that is the unsplit-equal exact path;
for q8 the prompts are chosen so its tokens differ from f32's, so the test also shows q8 was used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from wire_split import WireSplit

from skippy.client import PipelineClient
from skippy.launcher import StageProcesses, write_local_topology
from skippy.protocol import WireDtype
from skippy.runtime.slices import read_model_info
from skippy.transport.endpoints import request_endpoint

SPLIT, CTX, LANES, N_NEW = 3, 128, 1, 12
TIMEOUT_S = 60.0


async def generate(endpoint: str, prompts: Sequence[Sequence[int]], n_new: int) -> list[list[int]]:
    client = PipelineClient(endpoint)
    try:
        await client.status(timeout_s=TIMEOUT_S)
        out = []
        for prompt in prompts:  # one at a time: every batch holds one session, as in WireSplit.greedy
            handle = await client.submit(prompt, max_tokens=n_new)
            tokens, final = await asyncio.wait_for(handle.collect(), TIMEOUT_S)
            assert final.finish_reason == "length", final
            out.append(tokens)
        return out
    finally:
        client.close()


@pytest.mark.parametrize("dtype", list(WireDtype))
def test_pipeline_tokens_match_the_codec_in_that_dtype(tiny_model: Callable[..., Path],
                                                       tmp_path_factory: pytest.TempPathFactory, dtype: WireDtype) -> None:
    model = tiny_model("gemma3")
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, 400, n).tolist() for n in (9, 40)]
    reference = WireSplit(model, SPLIT, ctx_size=CTX, lane_count=LANES)
    try:
        expected = [reference.greedy(p, N_NEW, reference.wire(dtype)) for p in prompts]
        exact = [reference.greedy(p, N_NEW, reference.wire(WireDtype.F32)) for p in prompts]
    finally:
        reference.close()
    directory = tmp_path_factory.mktemp("wd")
    topology, configs = write_local_topology(directory, model, read_model_info(model).n_layer, [SPLIT], lane_count=LANES,
                                             ctx_size=CTX, extra={"n_threads": 1})
    with StageProcesses(topology, configs, directory / "run", ["--activation-wire-dtype", str(dtype)],
                        include_stage0=True) as stages:
        got = asyncio.run(generate(request_endpoint(stages.topology.first().endpoint), prompts, N_NEW))
    assert got == expected
    assert (got == exact) == (dtype is not WireDtype.Q8)  # q8 changes these continuations; f16 does not
