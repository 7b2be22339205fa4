"""Per-session sampling at the final stage with llama.cpp's sampler chain.

Chain order follows llama.cpp's common sampler: logit bias, penalties, top-k, top-p, min-p,
temperature, then a seeded draw; temperature <= 0 means greedy (bias and penalties still apply).
top_p 0 goes to llama.cpp's top-p sampler like any other value: it keeps at least one token (min_keep
1), the most likely, so the draw is greedy's token at any temperature. repeat_penalty must be > 0
(llama.cpp divides positive logits by it; 1 is off).
A GBNF `grammar` (structured output, tool calls) constrains every sampled token; it is checked and
advanced outside the chain (skippy.runtime.grammar_sampler) and only with the tokens this chain returns, which
the final stage returns as committed. Under a grammar a -inf logit bias becomes a very large finite
penalty, so that the grammar can always be satisfied.
A chain counts the draws of its seeded RNG (`draws`): llama.cpp's dist sampler (this build's
llama-sampling.cpp, `llama_sampler_dist_apply`) draws exactly once per apply, whatever the candidates
left, one candidate included (checked by tests/runtime/test_sampler_restore.py). `restore` rebuilds a
chain's state on another process: the committed tokens accepted (penalties' history, the grammar), and
the RNG advanced by applying the dist sampler alone `draws` times to a dummy two-candidate array.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import llama_cpp as L
import numpy as np

from skippy.protocol import TokenLogprob
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.grammar_sampler import MAX_GRAMMAR_BYTES, GrammarSampler, sample_with_grammar

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp picks a random seed


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler; validated on construction (names match OpenAI fields)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int = DEFAULT_SEED
    logit_bias: dict[int, float] = field(default_factory=dict)
    top_logprobs: int | None = None  # None: no logprobs; n: the sampled token's logprob and the top n
    grammar: str | None = None  # GBNF with a `root` rule that every sampled token must follow

    def __post_init__(self) -> None:
        checks = [
            ("temperature", self.temperature >= 0 and math.isfinite(self.temperature), ">= 0"),
            ("top_k", self.top_k >= 0, ">= 0"),
            ("top_p", 0 <= self.top_p <= 1, "in [0, 1]"),
            ("min_p", 0 <= self.min_p <= 1, "in [0, 1]"),
            ("presence_penalty", math.isfinite(self.presence_penalty), "finite"),
            ("frequency_penalty", math.isfinite(self.frequency_penalty), "finite"),
            ("repeat_penalty", self.repeat_penalty > 0 and math.isfinite(self.repeat_penalty), "> 0"),
            ("repeat_last_n", self.repeat_last_n >= -1, ">= -1"),
            ("seed", 0 <= self.seed <= 0xFFFFFFFF, "a uint32"),
            ("top_logprobs", self.top_logprobs is None or 0 <= self.top_logprobs <= 20, "in [0, 20]"),
            ("grammar", self.grammar is None or (isinstance(self.grammar, str)
                                                 and len(self.grammar.encode()) <= MAX_GRAMMAR_BYTES),
             f"GBNF text of at most {MAX_GRAMMAR_BYTES} bytes"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise RuntimeUsageError(f"sampling field {name!r} must be {rule}, got {getattr(self, name)!r}")
        for token, bias in self.logit_bias.items():
            if not math.isfinite(bias) and bias != -math.inf:
                raise RuntimeUsageError(f"logit_bias for token {token} must be finite or -inf, got {bias}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no penalties and no grammar (a logit bias at most): the chain keeps no state, and
        the sample is the first maximal biased logit (`biased_argmax`)."""
        return self.greedy and self.grammar is None and not (
            self.repeat_penalty != 1.0 or self.frequency_penalty or self.presence_penalty)

    @property
    def changes_logits(self) -> bool:
        """Bias or penalties: the chain's logits differ from the model's."""
        return bool(self.repeat_penalty != 1.0 or self.frequency_penalty or self.presence_penalty or self.logit_bias)

    def to_dict(self) -> dict[str, object]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["logit_bias"] = {int(k): float(v) for k, v in self.logit_bias.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> SamplingParams:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise RuntimeUsageError(f"unknown sampling fields: {', '.join(sorted(unknown))}")
        values = dict(d)
        if "logit_bias" in values:
            values["logit_bias"] = {int(k): float(v) for k, v in dict(values["logit_bias"]).items()}  # type: ignore[call-overload]
        return cls(**values)  # type: ignore[arg-type]


def biased_argmax(logits: np.ndarray, bias: dict[int, float]) -> int:
    """llama.cpp's greedy chain with a logit-bias sampler (bias added in float32, first maximum), without
    its vocabulary-sized candidate array per sample (262k entries on Gemma, costly each time; measured:
    docs/measurements.md, 'Greedy with a logit bias'), and without copying the row
    unless the unbiased maximum is itself biased."""
    top = int(np.argmax(logits))
    if not bias:
        return top
    if top in bias:  # the best unbiased token is unknown: bias a copy
        biased = logits.astype(np.float32, copy=True)
        biased[np.fromiter(bias, np.int64, len(bias))] += np.fromiter(bias.values(), np.float32, len(bias))
        return int(np.argmax(biased))
    # top is the first maximum of the unbiased tokens; a biased token wins above it, or at a tie before it
    best, value = top, np.float32(logits[top])
    for token, b in sorted(bias.items()):
        v = np.float32(logits[token]) + np.float32(b)
        if v > value or (v == value and token < best):
            best, value = token, v
    return best


GRAMMAR_BAN = -1e30  # a -inf logit bias under a grammar: banned unless the grammar allows nothing else


def token_logprob(raw_logits: np.ndarray, token: int, n: int) -> TokenLogprob:
    """log p(token) from a row's raw logits (log-softmax), with the top-n (n > 0) best first."""
    logits = raw_logits.astype(np.float64)
    peak = logits.max()
    log_z = peak + np.log(np.exp(logits - peak).sum())  # log-sum-exp
    top: tuple[tuple[int, float], ...] = ()
    if n > 0:
        best = np.argpartition(-logits, n)[:n]
        best = best[np.argsort(-logits[best], kind="stable")]
        top = tuple((int(t), float(logits[t] - log_z)) for t in best)
    return TokenLogprob(int(token), float(logits[token] - log_z), top)


class SamplerChain:
    """An owned llama.cpp sampler chain for one session (and its grammar, if the params carry one)."""

    def __init__(self, params: SamplingParams, n_vocab: int, vocab: ctypes.c_void_p | None = None) -> None:
        for token in params.logit_bias:
            if not 0 <= token < n_vocab:
                raise RuntimeUsageError(f"logit_bias token id {token} is outside the vocabulary (0..{n_vocab - 1})")
        self.params = params
        self.n_vocab = n_vocab
        self.grammar: GrammarSampler | None = None
        self.dist: ctypes.c_void_p | None = None  # the chain's seeded draw (owned by the chain)
        self.draws = 0  # RNG draws made so far
        if params.grammar is not None:
            if vocab is None:
                raise RuntimeUsageError("a grammar needs the model's vocabulary")
            self.grammar = GrammarSampler(vocab, params.grammar)
        self.ptr = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if params.logit_bias:
            floor = GRAMMAR_BAN if self.grammar is not None else -math.inf
            biases = (L.llama_logit_bias * len(params.logit_bias))(
                *(L.llama_logit_bias(token=t, bias=max(b, floor)) for t, b in params.logit_bias.items())
            )
            self._add(L.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), biases))
        if params.repeat_penalty != 1.0 or params.frequency_penalty or params.presence_penalty:
            self._add(
                L.llama_sampler_init_penalties(
                    n_vocab,
                    params.repeat_last_n,
                    params.repeat_penalty,
                    params.frequency_penalty,
                    params.presence_penalty,
                )
            )
        if params.greedy:
            self._add(L.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            self._add(L.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            self._add(L.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            self._add(L.llama_sampler_init_min_p(params.min_p, 1))
        self._add(L.llama_sampler_init_temp(params.temperature))
        self.dist = L.llama_sampler_init_dist(params.seed)
        self._add(self.dist)

    def _add(self, sampler: ctypes.c_void_p) -> None:
        L.llama_sampler_chain_add(self.ptr, sampler)

    def sample(self, ctx: ctypes.c_void_p, batch_index: int) -> int:
        """Sample from the logits of batch row `batch_index` and record the token in the chain's history
        (and advance the grammar by it)."""
        if self.grammar is None:
            self.draws += self.dist is not None  # one chain apply
            return int(L.llama_sampler_sample(self.ptr, ctx, batch_index))
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, batch_index), shape=(self.n_vocab,))
        greedy_first = self.params.greedy and not self.params.changes_logits
        token, applies = sample_with_grammar(self.ptr, self.grammar, logits, greedy_first)
        self.draws += applies if self.dist is not None else 0
        self.grammar.accept(token)
        L.llama_sampler_accept(self.ptr, token)
        return token

    def restore(self, history: Sequence[int], draws: int) -> None:
        """Bring a fresh chain to the state of one that sampled `history` with `draws` RNG draws: every token
        accepted (into the grammar too), the seeded RNG advanced `draws` times."""
        for token in history:
            if not 0 <= token < self.n_vocab:
                raise RuntimeUsageError(f"history token id {token} is outside the vocabulary (0..{self.n_vocab - 1})")
            if self.grammar is not None:
                if not self.grammar.allows(token):
                    raise RuntimeUsageError(f"history token {token} does not follow the session's grammar")
                self.grammar.accept(token)
            L.llama_sampler_accept(self.ptr, token)
        if draws and self.dist is None:
            raise RuntimeUsageError(f"{draws} RNG draws to restore, but the session's sampler draws none (greedy)")
        dummy = (L.llama_token_data * 2)()
        for _ in range(draws):
            dummy[0] = L.llama_token_data(id=0, logit=0.0, p=0.0)
            dummy[1] = L.llama_token_data(id=1, logit=0.0, p=0.0)
            array = L.llama_token_data_array(data=dummy, size=2, selected=-1, sorted=False)
            L.llama_sampler_apply(self.dist, ctypes.byref(array))
        self.draws = draws

    def close(self) -> None:
        if self.grammar is not None:
            self.grammar.close()
            self.grammar = None
        if self.ptr:
            L.llama_sampler_free(self.ptr)
            self.ptr = None
