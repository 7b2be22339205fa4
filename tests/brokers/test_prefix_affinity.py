"""The broker's prefix affinity (brokers.prefix_routing): which replica holds the longest run of a prompt's leading blocks.

Blocks chain (a prompt sharing only a later block matches nothing), a partial block never counts, of replicas holding
as many blocks the least loaded wins, memory per replica is bounded with the least recently used blocks dropped first,
and a forgotten replica holds nothing.
"""

from __future__ import annotations

from brokers.prefix_routing import PrefixAffinity, prefix_blocks

BLOCK = 4


def test_blocks_chain_and_a_partial_block_does_not_count() -> None:
    assert len(prefix_blocks(list(range(11)), BLOCK)) == 2
    a, b = prefix_blocks([1, 2, 3, 4, 5, 6, 7, 8], BLOCK), prefix_blocks([9, 9, 9, 9, 5, 6, 7, 8], BLOCK)
    assert a[1] != b[1]  # the same second block after a different first one


def test_the_replica_holding_the_longest_leading_run_wins() -> None:
    affinity = PrefixAffinity(block=BLOCK)
    blocks = affinity.blocks_of
    affinity.record("r0", blocks([1, 2, 3, 4, 9, 9, 9, 9]))
    affinity.record("r1", blocks([1, 2, 3, 4, 5, 6, 7, 8, 10]))
    idle = lambda _key: 0  # noqa: E731
    assert affinity.best(blocks([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0]), ["r0", "r1"], idle) == ("r1", 2)
    assert affinity.best(blocks([1, 2, 3, 4, 5, 6, 7, 8]), ["r0"], idle) == ("r0", 1)  # among the candidates only
    assert affinity.best(blocks([0, 2, 3, 4, 5, 6, 7, 8]), ["r0", "r1"], idle) == (None, 0)
    assert affinity.best(blocks([1, 2, 3]), ["r0", "r1"], idle) == (None, 0)  # shorter than a block
    load = {"r0": 3, "r1": 1}
    assert affinity.best(blocks([1, 2, 3, 4, 0, 0, 0, 0]), ["r0", "r1"], load.__getitem__) == ("r1", 1)  # equals: less loaded
    affinity.forget("r1")
    assert affinity.best(blocks([1, 2, 3, 4, 5, 6, 7, 8]), ["r0", "r1"], idle) == ("r0", 1)


def test_memory_per_replica_is_bounded_least_recently_used_first() -> None:
    affinity = PrefixAffinity(max_blocks=3, block=BLOCK)
    blocks = affinity.blocks_of
    affinity.record("r0", blocks([1] * 8))  # two blocks
    affinity.record("r0", blocks([2] * 8))  # two more: the oldest block goes
    assert affinity.blocks("r0") == 3
    assert affinity.best(blocks([1] * 8), ["r0"], lambda _key: 0) == (None, 0)  # its first block was the one dropped
    assert affinity.best(blocks([2] * 8), ["r0"], lambda _key: 0) == ("r0", 2)
