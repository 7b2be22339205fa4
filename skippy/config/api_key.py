"""The HTTP API key as every process reads it: from the environment, a file or (visibly) a flag.

One key guards every HTTP door of a run: the adapter's routes (skippy.http.auth) and each stage's,
driver's and broker's /metrics (skippy.telemetry.metrics_server). It comes from `$SKIPPY_OPENAI_API_KEY`
(what `skippy up` hands every child: environments are not visible to other users, command lines
are), from `--openai-api-key-file PATH`, or from `--openai-api-key KEY`, which still works but leaves
the key on the command line (`ps`, /proc/PID/cmdline), so it earns a warning (`COMMAND_LINE_WARNING`).
Tokens are compared in constant time (`bearer_matches`).
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from skippy.config.errors import ConfigError
from skippy.config.link_keys import non_loopback

__all__ = ["API_KEY_ENV", "COMMAND_LINE_WARNING", "api_key_from", "bearer_matches", "bearer_token", "open_bind_warning",
           "read_api_key_file"]

API_KEY_ENV = "SKIPPY_OPENAI_API_KEY"
COMMAND_LINE_WARNING = ("--openai-api-key: the key is visible to every local user on this command line (ps,"
                        f" /proc/PID/cmdline); prefer ${API_KEY_ENV} or --openai-api-key-file PATH")


def api_key_from(flag: str | None) -> str | None:
    """The key: the flag's value, else the environment's; None (or empty): no key, the door is open."""
    key = (flag if flag is not None else os.environ.get(API_KEY_ENV, "")).strip()
    return key or None


def read_api_key_file(path: str | Path, flag: str = "--openai-api-key-file") -> str:
    """The key in `path` (surrounding whitespace dropped); ConfigError naming the flag and file otherwise."""
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{flag} {path}: cannot read the key file ({exc})") from None
    if not key:
        raise ConfigError(f"{flag} {path}: the key file is empty")
    return key


def bearer_token(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header value (None: no Bearer token)."""
    scheme, _, token = authorization.strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def bearer_matches(token: str | None, key: str | bytes) -> bool:
    """`token` is the key (constant time, on the header's own bytes)."""
    if token is None:
        return False
    expected = key.encode() if isinstance(key, str) else key
    try:
        given = token.encode("latin-1")
    except UnicodeEncodeError:
        given = token.encode("utf-8", "replace")
    return hmac.compare_digest(given, expected)


def open_bind_warning(bind: str, key: str | None, flag: str) -> str | None:
    """The warning for an HTTP door on a non-loopback `bind` (HOST:PORT) without an API key (None: fine)."""
    host = bind.rpartition(":")[0] or bind
    if key is not None or not non_loopback(f"tcp://{host}:0"):
        return None
    return (f"{flag} {bind}: a non-loopback address without an API key: anyone who reaches it uses the API;"
            f" set ${API_KEY_ENV} or --openai-api-key-file PATH")
