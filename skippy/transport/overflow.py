"""What a bounded queue refuses: counted every time, logged once per episode.

A queue toward a peer that stops reading (a client that stalls, a flood of submits) overflows again and
again; one warning per refused item would flood the log instead. `Overflows` keeps, per key (an
endpoint, a client), whether an episode is under way: the first refusal logs a warning `event` with its
fields, later ones are only counted (`count`, the observer's Prometheus counter, and the episode's
tally), and the first success after them logs `<event>_ended` (info) with how many were refused.
Episodes are kept for `max_keys` keys at most (the oldest is dropped, still counted): keys may come from
peers (client ids), and a peer that goes away mid-episode never ends its episode.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["MAX_KEYS", "Overflows"]

MAX_KEYS = 1024  # episodes under way kept at most


class Overflows:
    def __init__(self, event: str, log: Any, count: Callable[[], None] | None = None, *, max_keys: int = MAX_KEYS) -> None:
        """`event`: the warning's name; `log`: a structlog logger; `count`: called on every refusal."""
        self.event = event
        self.max_keys = max_keys
        self.log = log
        self.count = count
        self.total = 0  # refusals, all keys together
        self._episodes: dict[Hashable, int] = {}  # key -> refusals in its episode under way

    def refused(self, key: Hashable, **fields: Any) -> bool:
        """One refusal for `key`; True when it starts an episode (and was logged)."""
        self.total += 1
        if self.count is not None:
            self.count()
        started = key not in self._episodes
        if started and len(self._episodes) >= self.max_keys:
            del self._episodes[next(iter(self._episodes))]  # the oldest episode: its refusals stay counted
        self._episodes[key] = self._episodes.get(key, 0) + 1
        if started:
            self.log.warning(self.event, **fields)
        return started

    def ok(self, key: Hashable, **fields: Any) -> None:
        """`key`'s queue took an item: an episode under way ends (logged with its count)."""
        if self._episodes:  # the common case, no episode anywhere, costs one test
            refused = self._episodes.pop(key, None)
            if refused is not None:
                self.log.info(f"{self.event}_ended", refused=refused, **fields)

    def forget(self, key: Hashable) -> None:
        """`key` is gone (closed, disconnected): drop its episode without a line."""
        self._episodes.pop(key, None)

    def under_way(self, key: Hashable) -> bool:
        return key in self._episodes
