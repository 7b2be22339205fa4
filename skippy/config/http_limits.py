"""The adapter's HTTP limits: what a client may take of the server (bytes, time, connections).

:class:`HttpLimits` is what skippy.http.server enforces: body and header sizes (413 / 431), the time
a request head may take to arrive (from the connection's accept, or from its first byte on a kept-alive
connection) and its body (from the end of its head), how long a kept-alive connection may sit idle
between requests, and how many connections may be open at once (beyond that a 503). The times are
deadlines for the whole head or body, not per read, so a client trickling a byte at a time cannot hold
a connection past them.

The launchers' ``--openai-http-*`` flags set the three a deployment tunes (:data:`HTTP_LIMIT_FLAGS`,
read by :func:`resolve_http_limits`); ``HttpLimits.adapter_flags`` writes them as the flags of
``skippy adapter`` (``--http-head-timeout-s`` ...), which builds the same object from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from skippy.config.errors import FieldError
from skippy.config.schema import ConfigModel, check
from skippy.config.serving_args import FlagReader

__all__ = ["ADAPTER_FLAGS", "HTTP_LIMIT_FLAGS", "HttpLimits", "resolve_http_limits"]

# field -> the launchers' flag (skippy up, skippy stage --openai-bind-addr) and skippy adapter's flag
HTTP_LIMIT_FLAGS = {
    "head_timeout_s": "--openai-http-head-timeout-s",
    "body_timeout_s": "--openai-http-body-timeout-s",
    "max_connections": "--openai-http-max-connections",
}
ADAPTER_FLAGS = {name: flag.replace("--openai-http-", "--http-") for name, flag in HTTP_LIMIT_FLAGS.items()}


@dataclass(frozen=True, kw_only=True)
class HttpLimits(ConfigModel):
    """Sizes, deadlines and the connection cap of one HTTP server (the defaults are production's)."""

    max_body_bytes: int = 4 << 20  # 413 beyond (declared by Content-Length or counted while chunked)
    max_header_bytes: int = 64 << 10  # 431 beyond
    head_timeout_s: float = 30.0  # the whole request head, from accept (or its first byte when kept alive)
    body_timeout_s: float = 60.0  # the whole request body, from the end of its head
    idle_timeout_s: float = 60.0  # a kept-alive connection waiting for its next request
    max_connections: int = 512  # open at once; one more is answered 503 and closed

    def _check(self) -> None:
        check(self.max_body_bytes > 0, "max_body_bytes", f"must be > 0, got {self.max_body_bytes}")
        check(self.max_header_bytes > 0, "max_header_bytes", f"must be > 0, got {self.max_header_bytes}")
        for name in ("head_timeout_s", "body_timeout_s", "idle_timeout_s"):
            value = getattr(self, name)
            check(math.isfinite(value) and value > 0, name, f"must be finite and > 0, got {value:g}")
        check(self.max_connections > 0, "max_connections", f"must be > 0, got {self.max_connections}")

    def adapter_flags(self) -> list[str]:
        """These limits as `skippy adapter` flags (what the launchers' flags set)."""
        return [arg for name, flag in ADAPTER_FLAGS.items() for arg in (flag, str(getattr(self, name)))]


def resolve_http_limits(flags: FlagReader, names: dict[str, str] = HTTP_LIMIT_FLAGS) -> HttpLimits:
    """The limits `names` (field -> flag) set in `flags`, the defaults for the rest; errors name the flag."""
    default = HttpLimits()
    try:
        return HttpLimits(
            head_timeout_s=flags.number(names["head_timeout_s"], default.head_timeout_s, positive=True),
            body_timeout_s=flags.number(names["body_timeout_s"], default.body_timeout_s, positive=True),
            max_connections=flags.integer(names["max_connections"], default.max_connections),
        )
    except FieldError as error:
        raise error.as_flag(names[error.field]) from None
