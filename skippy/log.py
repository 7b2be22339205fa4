"""Structured logs: one JSON object per line with `ts`, `level`, `event` and the process's bound ids.

Every process calls `configure_logging` once; `ready` and `stopped` lifecycle lines are always
written, whatever the telemetry level, so scripts can wait on them and `scripts/tail-logs` can
merge the files of a run in time order.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

LEVELS = {"off": logging.WARNING, "summary": logging.INFO, "debug": logging.DEBUG}
ALWAYS = frozenset({"ready", "stopped"})
_threshold = logging.INFO


def _timestamp(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event["ts"] = round(time.time(), 6)
    return event


def _filter(_logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    level = logging.getLevelName(method.upper())
    if isinstance(level, int) and level < _threshold and event.get("event") not in ALWAYS:
        raise structlog.DropEvent
    return event


def configure_logging(telemetry_level: str = "summary", stream: TextIO | None = None, **bound: Any) -> None:
    """JSON lines to `stream` (stderr by default) at the telemetry level (off | summary | debug)."""
    global _threshold
    _threshold = LEVELS.get(str(telemetry_level), logging.INFO)
    structlog.reset_defaults()
    structlog.configure(
        processors=[
            _filter,
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _timestamp,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=False),
        ],
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(**bound)


def get_logger(**bound: Any) -> Any:
    """A logger assembled now, with the configuration in force (call after configure_logging)."""
    return structlog.get_logger().bind(**bound)


def module_logger(**bound: Any) -> Any:
    """A logger for module level, made before the process configures logging: it takes the configuration
    in force at each call (so JSON lines, not the console format of an unconfigured structlog)."""
    return structlog.get_logger(**bound)


READY_FD_ENV = "SKIPPY_READY_FD"  # set by skippy.launcher: the pipe a child announces its readiness on
_ready_fields: dict[str, Any] = {}  # process-wide fields every `ready` line carries (e.g. metrics_url)


def add_ready_fields(**fields: Any) -> None:
    """Fields the process's `ready` line will carry besides its own (e.g. where its /metrics is)."""
    _ready_fields.update(fields)


def announce_ready(log: Any, **fields: Any) -> None:
    """Log the `ready` line and, when started by skippy.launcher, hand the same fields to the parent
    over its readiness pipe (bound endpoints, URLs): readiness by handshake, not by reading logs."""
    fields = {**_ready_fields, **fields}
    log.info("ready", **fields)
    fd = os.environ.pop(READY_FD_ENV, None)  # once, and not inherited by this process's own children
    if fd is None:
        return
    try:
        with os.fdopen(int(fd), "w") as pipe:
            pipe.write(json.dumps({"event": "ready", **fields}, default=str) + "\n")
    except (OSError, ValueError) as exc:
        log.warning("ready_pipe_failed", fd=fd, error=str(exc))
