"""Stop strings enforced on generated text: nothing that could start a stop string is released early."""

from __future__ import annotations


class StopMatcher:
    """Feed text deltas; get back the text safe to emit, and whether a stop string was hit."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that was hit (Anthropic reports it)

    def push(self, delta: str) -> str:
        if self.stopped:
            return ""
        text = self._held + delta
        hits = sorted((i, n, s) for n, s in enumerate(self.stops) if (i := text.find(s)) >= 0)
        if hits:
            self.stopped = True
            self._held = ""
            self.matched = hits[0][2]
            return text[: hits[0][0]]
        keep = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At the end of generation the held-back tail is real text."""
        text, self._held = self._held, ""
        return "" if self.stopped else text
