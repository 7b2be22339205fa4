"""The stage prefix (prompt) KV cache settings: the StageConfig field `kv_cache`.

`record` and `lookup-record` turn the cache on (skippy.runtime.prefix_cache on every stage, decided by
stage 0's skippy.driver.prefix_index); stage 0's mode decides whether prompts are looked up.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from skippy.config.schema import ConfigModel, check

__all__ = ["KvCacheConfig", "KvCacheMode", "KvCachePayload"]


class KvCacheMode(enum.StrEnum):
    DISABLED = "disabled"
    AUTO = "auto"
    RECORD = "record"
    LOOKUP_RECORD = "lookup-record"


class KvCachePayload(enum.StrEnum):
    AUTO = "auto"
    RESIDENT_KV = "resident-kv"
    KV_RECURRENT = "kv-recurrent"
    FULL_STATE = "full-state"


@dataclass(frozen=True)
class KvCacheConfig(ConfigModel):
    """Prefix (prompt) KV cache settings: a stage config's `kv_cache` fields and their defaults."""

    mode: KvCacheMode = KvCacheMode.AUTO
    payload: KvCachePayload = KvCachePayload.AUTO
    max_entries: int = 64
    max_bytes: int = 0  # 0 = no byte cap
    min_tokens: int = 64
    shared_prefix_stride_tokens: int = 128
    shared_prefix_record_limit: int = 2

    def _check(self) -> None:
        check(self.max_entries > 0, "max_entries", f"must be > 0, got {self.max_entries}")
        stride = self.shared_prefix_stride_tokens
        check(stride > 0, "shared_prefix_stride_tokens", f"must be > 0, got {stride}")

    @property
    def should_lookup(self) -> bool:
        return self.mode is KvCacheMode.LOOKUP_RECORD

    @property
    def should_record(self) -> bool:
        return self.mode in (KvCacheMode.RECORD, KvCacheMode.LOOKUP_RECORD)
