"""SessionSamplers: the final stage's sampler chain per session, and what it samples from a logits row.

A session without a configured chain samples greedily with default parameters. Plain greedy (no grammar, no
penalties: nothing whose state advances with each sample) is an argmax on llama.cpp's logits row, no copy;
anything else goes through the session's llama.cpp sampler chain (skippy.runtime.sampling).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from skippy.protocol import TokenLogprob
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.llama_api import LlamaContext
from skippy.runtime.sampling import SamplerChain, SamplingParams, biased_argmax, token_logprob


class SessionSamplers:
    def __init__(self, n_vocab: int, vocab: ctypes.c_void_p | None) -> None:
        self.n_vocab, self._vocab = n_vocab, vocab
        self._chains: dict[int, SamplerChain] = {}

    def configure(self, session_id: int, params: SamplingParams, history: Sequence[int] = (), draws: int = 0) -> None:
        """Set the session's chain, replacing any earlier one; a replayed session's `history` (committed tokens)
        and `draws` (RNG draws made) restore its state (`SamplerChain.restore`)."""
        chain = SamplerChain(params, self.n_vocab, self._vocab)
        if history or draws:
            try:
                chain.restore(history, draws)
            except RuntimeUsageError:
                chain.close()
                raise
        self.release(session_id)
        self._chains[session_id] = chain

    def sample(self, session_id: int, ctx: LlamaContext, row: int) -> int:
        chain = self._chains.get(session_id)
        if chain is None:
            chain = self._chains[session_id] = SamplerChain(SamplingParams(), self.n_vocab)
        if chain.params.plain_greedy:
            return biased_argmax(ctx.logits_row(row, self.n_vocab), chain.params.logit_bias)
        return chain.sample(ctx.ptr, row)

    def draws(self, session_id: int) -> int:
        """RNG draws the session's chain has made (0: none, or greedy)."""
        chain = self._chains.get(session_id)
        return 0 if chain is None else chain.draws

    def logprobs(self, session_id: int, ctx: LlamaContext, row: int, token: int) -> TokenLogprob | None:
        """log p(token) from the row's raw logits (log-softmax) and the top-n, if the session asked."""
        chain = self._chains.get(session_id)
        n = None if chain is None else chain.params.top_logprobs
        return None if n is None else token_logprob(ctx.logits_row(row, self.n_vocab), token, n)

    def release(self, session_id: int) -> None:
        chain = self._chains.pop(session_id, None)
        if chain is not None:
            chain.close()

    def close(self) -> None:
        for session_id in list(self._chains):
            self.release(session_id)
