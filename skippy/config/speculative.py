"""SpeculativeDecodeConfig: the typed speculative-decoding plan (the JSON of `--openai-speculative-config`).

A plan says which proposers run (native MTP heads, an N-gram proposer, an
N-gram tail extending an MTP prefix) and how verify windows are sized.  It
rejects unknown keys at every level; ``validate()`` applies
the semantic rules and is run by ``load`` / ``from_dict``; a draft count above what a verify window carries
(``MAX_DRAFT_TOKENS``) is refused naming its field, never clamped.  ``to_json`` is
stable (sorted keys) so a plan can be logged and compared byte for byte.

Strategy fields: ``effective_strategy`` is honoured: ``"disabled"`` turns speculation off entirely
(an ``ngram`` section is then not used); any other value is a label that needs a proposer.  A plan
file that omits it gets what runs: ``"native-mtp"`` (``"native-mtp+ngram-cache"`` with an ``extension``)
when ``native_mtp.enabled``, else ``"ngram-<kind>"`` with an ``ngram`` section.
``requested_strategy`` is metadata: what was asked of the planner that wrote the plan (e.g.
"auto"); logged at startup, never acted on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Self

from skippy.config.errors import FieldError
from skippy.config.schema import ConfigModel, check

__all__ = [
    "DISABLED",
    "MAX_CACHE_NGRAM",
    "MAX_DRAFT_TOKENS",
    "MAX_SUFFIX_NGRAM",
    "MAX_VERIFY_WINDOW_PIPELINE_DEPTH",
    "MIN_SUFFIX_NGRAM",
    "NativeMtpConfig",
    "NgramConfig",
    "NgramExtensionConfig",
    "NgramKind",
    "SpeculativeDecodeConfig",
    "VerifyWindowConfig",
]

MAX_CACHE_NGRAM = 4  # llama.cpp's request-local n-gram cache match window
MIN_SUFFIX_NGRAM = 3
MAX_SUFFIX_NGRAM = 64
MAX_VERIFY_WINDOW_PIPELINE_DEPTH = 64
# drafts one verify window carries at most: the final stage keeps logits for that many rows a lane
# (skippy.runtime.stage_params.MAX_DRAFT_TOKENS) and the wire asks for that many MTP drafts (MAX_MTP_DRAFT)
MAX_DRAFT_TOKENS = 16
DISABLED = "disabled"  # the effective_strategy that turns speculation off


class NgramKind(enum.StrEnum):
    CACHE = "cache"
    SUFFIX = "suffix"


@dataclass(frozen=True, kw_only=True)
class NativeMtpConfig(ConfigModel):
    """Drafts produced by the model's own multi-token-prediction heads."""

    enabled: bool = False
    max_draft_tokens: int = 1
    min_draft_tokens: int = 0
    reject_cooldown_tokens: int = 0
    suppress_cooldown_drafts: bool = False
    suppress_cooldown_draft_limit: int = 0


@dataclass(frozen=True, kw_only=True)
class NgramConfig(ConfigModel):
    """A request-local N-gram proposer (llama.cpp cache or pure suffix index)."""

    kind: NgramKind = NgramKind.CACHE
    min_ngram: int
    max_ngram: int
    max_proposal_tokens: int


@dataclass(frozen=True, kw_only=True)
class NgramExtensionConfig(ConfigModel):
    """An N-gram tail appended to a native-MTP prefix."""

    max_tokens: int


@dataclass(frozen=True, kw_only=True)
class VerifyWindowConfig(ConfigModel):
    """Size bounds of a verify window and how many may be in flight."""

    min_tokens: int = 1
    max_tokens: int = 4
    pipeline_depth: int = 1
    runahead_max_tokens: int = 0  # draft tokens one session has in flight at most; 0 = pipeline_depth windows


@dataclass(frozen=True, kw_only=True)
class SpeculativeDecodeConfig(ConfigModel):
    """The full speculative-decoding plan, as loaded from ``--*speculative-config``."""

    requested_strategy: str = "auto"
    effective_strategy: str = DISABLED
    native_mtp: NativeMtpConfig = field(default_factory=NativeMtpConfig)
    ngram: NgramConfig | None = None
    extension: NgramExtensionConfig | None = None
    verify_window: VerifyWindowConfig = field(default_factory=VerifyWindowConfig)

    @property
    def drafting(self) -> tuple[str, ...]:
        """What in the plan asks for drafting, e.g. ``("native_mtp.enabled",)``; the default: ()."""
        asks = {
            "native_mtp.enabled": self.native_mtp.enabled,
            "ngram": self.ngram is not None,
            "extension": self.extension is not None,
            f"effective_strategy '{self.effective_strategy}'": not self.disabled,
        }
        return tuple(name for name, on in asks.items() if on)

    @property
    def disabled(self) -> bool:
        """``effective_strategy`` is "disabled": no proposer runs, whatever the other sections say."""
        return self.effective_strategy == DISABLED

    @property
    def active_ngram(self) -> NgramConfig | None:
        """The ngram section when it drafts (None when absent or the plan is disabled)."""
        return None if self.disabled else self.ngram

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> Self:
        """Parse and validate; errors are ``<source>: field '...' ...``. A plan with an ngram section and no
        effective_strategy gets "ngram-<kind>" (module docstring)."""
        if isinstance(data, dict) and "effective_strategy" not in data:
            mtp = data.get("native_mtp")
            if isinstance(mtp, dict) and mtp.get("enabled") is True:  # what runs: docs/mtp.md
                tail = "+ngram-cache" if isinstance(data.get("extension"), dict) else ""
                data = {**data, "effective_strategy": f"native-mtp{tail}"}
            elif isinstance(data.get("ngram"), dict):
                data = {**data, "effective_strategy": f"ngram-{data['ngram'].get('kind', NgramKind.CACHE.value)}"}
        plan = super().from_dict(data, source)
        plan.validate(source)
        return plan

    def validate(self, source: str | None = None) -> None:
        """Apply the plan rules; ConfigError naming the field (and ``source``)."""
        try:
            self._validate_rules()
        except FieldError as error:
            raise (error.in_source(source) if source else error) from None

    def _validate_rules(self) -> None:
        for name in ("requested_strategy", "effective_strategy"):
            check(getattr(self, name).strip() != "", name, "must not be empty")
        mtp = self.native_mtp
        check(
            1 <= mtp.max_draft_tokens <= MAX_DRAFT_TOKENS,
            "native_mtp.max_draft_tokens",
            f"must be in 1..{MAX_DRAFT_TOKENS} (the final stage drafts at most {MAX_DRAFT_TOKENS} a window;"
            f" 0 would draft nothing), got {mtp.max_draft_tokens}",
        )
        check(
            mtp.min_draft_tokens <= mtp.max_draft_tokens,
            "native_mtp.min_draft_tokens",
            f"must be <= native_mtp.max_draft_tokens ({mtp.max_draft_tokens}),"
            f" got {mtp.min_draft_tokens}",
        )
        if self.ngram is not None:
            self._validate_ngram(self.ngram)
        if self.extension is not None:
            check(mtp.enabled, "extension", "requires native_mtp.enabled = true")
            check(self.ngram is not None, "extension", "requires an ngram proposer")
            limit = self.extension.max_tokens
            check(limit > 0, "extension.max_tokens", f"must be > 0, got {limit}")
            check(limit <= MAX_DRAFT_TOKENS, "extension.max_tokens", _window_bound(limit))
        window = self.verify_window
        low = window.min_tokens
        check(low > 0, "verify_window.min_tokens", f"must be > 0, got {low}")
        check(
            window.min_tokens <= window.max_tokens,
            "verify_window.max_tokens",
            f"must be >= verify_window.min_tokens ({window.min_tokens}), got {window.max_tokens}",
        )
        check(window.max_tokens <= MAX_DRAFT_TOKENS, "verify_window.max_tokens", _window_bound(window.max_tokens))
        runahead = window.runahead_max_tokens
        check(
            runahead == 0 or runahead >= low,
            "verify_window.runahead_max_tokens",
            f"must be 0 (no cap) or >= verify_window.min_tokens ({low}), got {runahead}",
        )
        depth = window.pipeline_depth
        check(
            0 < depth <= MAX_VERIFY_WINDOW_PIPELINE_DEPTH,
            "verify_window.pipeline_depth",
            f"must be in 1..{MAX_VERIFY_WINDOW_PIPELINE_DEPTH}, got {depth}",
        )

    @staticmethod
    def _validate_ngram(ngram: NgramConfig) -> None:
        low, high = ngram.min_ngram, ngram.max_ngram
        check(low > 0, "ngram.min_ngram", f"must be > 0, got {low}")
        check(low <= high, "ngram.max_ngram", f"must be >= ngram.min_ngram ({low}), got {high}")
        tokens = ngram.max_proposal_tokens
        check(tokens > 0, "ngram.max_proposal_tokens", f"must be > 0, got {tokens}")
        check(tokens <= MAX_DRAFT_TOKENS, "ngram.max_proposal_tokens", _window_bound(tokens))
        if ngram.kind is NgramKind.CACHE:
            check(
                high <= MAX_CACHE_NGRAM,
                "ngram.max_ngram",
                f"must be <= {MAX_CACHE_NGRAM} for kind 'cache', got {high}",
            )
        else:
            check(
                low >= MIN_SUFFIX_NGRAM,
                "ngram.min_ngram",
                f"must be >= {MIN_SUFFIX_NGRAM} for kind 'suffix', got {low}",
            )
            check(
                high <= MAX_SUFFIX_NGRAM,
                "ngram.max_ngram",
                f"must be <= {MAX_SUFFIX_NGRAM} for kind 'suffix', got {high}",
            )


def _window_bound(value: int) -> str:
    return f"must be <= {MAX_DRAFT_TOKENS} (a verify window carries at most {MAX_DRAFT_TOKENS} drafts), got {value}"
