"""Prefix affinity for routing over replicas: a prompt goes where its beginning went before.

Each replica keeps its own prefix cache at its stage 0, so a conversation's next turn, or an agent's next call
repeating its system prompt and tools, prefills least on the replica that served the earlier one. Least-loaded
routing alone sends it wherever fewer requests are in flight. `PrefixAffinity` remembers, per replica, chained
hashes of the leading `block`-token blocks of the prompts routed there (at most `max_blocks` per replica, the
least recently used dropped) and names the candidate holding the longest run of a new prompt's leading blocks (of
those holding as many, the least loaded: a prefix every replica holds, such as a shared system prompt, pins none).
The pool (brokers.pool) takes it unless it has more than `slack` requests in flight beyond the least loaded:
an idle core beats a warm cache that is busy. A replica whose stage 0 went silent is forgotten (a restarted
stage 0 starts with an empty cache).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

__all__ = ["BLOCK", "MAX_BLOCKS", "PrefixAffinity", "prefix_blocks"]

BLOCK = 32  # tokens per hashed block: a shorter shared prefix is not worth leaving the least loaded replica for
MAX_BLOCKS = 8192  # blocks remembered per replica (about 260k prompt tokens at 32 a block)

Key = TypeVar("Key", bound=Hashable)


def prefix_blocks(prompt: Sequence[int], block: int = BLOCK) -> list[int]:
    """Hashes of prompt[:block], prompt[:2 block], ...: each block's hash chains the one before it."""
    hashes, h = [], 0
    for end in range(block, len(prompt) + 1, block):
        h = hash((h, tuple(prompt[end - block:end])))
        hashes.append(h)
    return hashes


class PrefixAffinity:
    def __init__(self, max_blocks: int = MAX_BLOCKS, block: int = BLOCK) -> None:
        self.max_blocks, self.block = max_blocks, block
        self._seen: dict[Hashable, OrderedDict[int, None]] = {}

    def blocks_of(self, prompt: Sequence[int]) -> list[int]:
        return prefix_blocks(prompt, self.block)

    def best(self, blocks: Sequence[int], candidates: Sequence[Key], load: Callable[[Key], int]) -> tuple[Key | None, int]:
        """The candidate holding the most of a prompt's leading `blocks` (blocks_of; the least `load` among equals)
        and how many; (None, 0): no candidate holds its first block."""
        held = {key: self._held(blocks, key) for key in candidates}
        best = max(candidates, key=lambda key: (held[key], -load(key)), default=None)
        return (best, held[best]) if best is not None and held[best] else (None, 0)

    def _held(self, blocks: Sequence[int], key: Hashable) -> int:
        seen = self._seen.get(key)
        if not seen:
            return 0
        return next((i for i, h in enumerate(blocks) if h not in seen), len(blocks))

    def record(self, key: Hashable, blocks: Sequence[int]) -> None:
        seen = self._seen.setdefault(key, OrderedDict())
        for h in blocks:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self.max_blocks:
            seen.popitem(last=False)

    def forget(self, key: Hashable) -> None:
        self._seen.pop(key, None)

    def blocks(self, key: Hashable) -> int:
        return len(self._seen.get(key, ()))
