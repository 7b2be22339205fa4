"""Grammar-constrained sampling at the final stage: valid output, committed-only grammar state with
verify windows, a grammar always satisfiable under logit bias, no plain-greedy shortcut, bad GBNF refused."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest
from runtime_helpers import prompt_tokens, window

from skippy.adapter.grammar.json_schema import GrammarBuilder
from skippy.runtime.chain import LocalChain
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.grammar_sampler import Candidates, GrammarSampler
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.tokenizer import Tokenizer
from skippy.runtime.windows import DecodeResult
from skippy.stage.final_sampling import VerifySpec, predict
from skippy.testing.tiny_models import EOS_ID

PROMPT = prompt_tokens(16, seed=41)
SCHEMA = {"type": "object", "required": ["a", "b", "c"], "properties": {
    "a": {"enum": ["x", "yy"]}, "b": {"type": "boolean"},
    "c": {"type": "array", "items": {"enum": [1, 2]}, "maxItems": 3}}}
STOP = frozenset({EOS_ID})


def schema_grammar() -> str:
    builder = GrammarBuilder()
    return builder.grammar(builder.rule_for(SCHEMA, "response", "schema"))


def check_output(chain: LocalChain, tokens: list[int]) -> None:
    """Ends with EOS, and the text before it is a JSON object valid against SCHEMA."""
    assert tokens[-1] == EOS_ID, tokens
    value = json.loads(Tokenizer(chain.final.model).decode(tokens[:-1]))
    assert set(value) == {"a", "b", "c"} and value["a"] in ("x", "yy") and isinstance(value["b"], bool)
    assert len(value["c"]) <= 3 and all(v in (1, 2) for v in value["c"])


@pytest.mark.parametrize("params", [
    SamplingParams(), SamplingParams(temperature=1.0, seed=3),
    SamplingParams(temperature=0.8, top_k=40, top_p=0.9, repeat_penalty=1.3, presence_penalty=0.5, seed=9),
], ids=["greedy", "seeded", "penalised"])
def test_output_follows_the_grammar(unsplit_chain: Callable[[str], LocalChain], params: SamplingParams) -> None:
    chain = unsplit_chain("llama")
    free = list(chain.generate(PROMPT, 40, params, stop_tokens=STOP))
    constrained = SamplingParams(**{**params.to_dict(), "grammar": schema_grammar()})  # type: ignore[arg-type]
    assert not constrained.plain_greedy  # the argmax shortcut would skip the grammar
    tokens = list(chain.generate(PROMPT, 100, constrained, stop_tokens=STOP))
    check_output(chain, tokens)
    assert tokens != free


def test_verify_windows_advance_the_grammar_only_with_committed_tokens(
        unsplit_chain: Callable[[str], LocalChain]) -> None:
    """Drafts with a wrong token at every third row: the rows after a mismatch are never sampled, so the
    grammar (and the RNG) see exactly the committed tokens and the result equals plain decoding."""
    chain, sid = unsplit_chain("llama"), 5
    params = SamplingParams(temperature=1.0, seed=21, grammar=schema_grammar())
    reference = list(chain.generate(PROMPT, 100, params, stop_tokens=STOP))
    check_output(chain, reference)
    final = chain.final
    final.configure_session(sid, params)
    try:
        rows = chain.decode([window(sid, 0, PROMPT, "last")])
        got = [final.sample(sid, rows[0][0])]
        pos = len(PROMPT)
        while got[-1] != EOS_ID:
            draft = list(reference[len(got) : len(got) + 4])
            if len(draft) >= 3:
                draft[2] = (draft[2] + 1) % final.n_vocab  # a mismatch the sampler must reject
            w = window(sid, pos, [got[-1], *draft])
            result = DecodeResult(None, chain.decode([w]))
            (prediction,) = predict(final, [w], result, [VerifySpec(tuple(draft))])
            assert len(prediction.tokens) <= min(len(draft), 2) + 1  # sampling stopped at the mismatch
            pos += len(prediction.tokens)
            got += prediction.tokens
        assert got[: got.index(EOS_ID) + 1] == reference  # stage 0 commits up to the first stop token
    finally:
        chain.release(sid)


def test_a_banned_grammar_token_is_still_sampled_when_nothing_else_is_allowed(
        unsplit_chain: Callable[[str], LocalChain]) -> None:
    chain = unsplit_chain("llama")
    grammar = GrammarSampler(chain.final.model.vocab, 'root ::= "ab"')
    try:
        start = Candidates(np.zeros(chain.final.n_vocab, np.float32))
        start.apply(grammar.ptr)
        allowed = np.flatnonzero(np.isfinite(start.data["logit"])).tolist()
    finally:
        grammar.close()
    assert allowed
    bias = {t: -100.0 for t in allowed}  # -100 is -inf: without the grammar these could never be sampled
    for params in (SamplingParams(logit_bias=bias), SamplingParams(temperature=1.0, seed=1, logit_bias=bias)):
        tokens = list(chain.generate(PROMPT, 8, SamplingParams(**{**params.to_dict(), "grammar": 'root ::= "ab"'}),
                                     stop_tokens=STOP))
        assert tokens[0] in allowed
        assert Tokenizer(chain.final.model).decode(tokens[:-1]) == "ab" and tokens[-1] == EOS_ID


def test_a_grammar_that_does_not_parse_is_refused(unsplit_chain: Callable[[str], LocalChain]) -> None:
    final = unsplit_chain("llama").final
    with pytest.raises(RuntimeUsageError, match="does not parse"):
        final.configure_session(7, SamplingParams(grammar="root ::= undefined-rule"))
    with pytest.raises(RuntimeUsageError, match="grammar"):
        SamplingParams(grammar="x" * (1 << 20))
    assert SamplingParams.from_dict(SamplingParams(grammar='root ::= "a"').to_dict()).grammar == 'root ::= "a"'
