"""Helpers for the tests of a stage that comes back: requests decoding, a stage restarted, bounded waits.

A stage restarted here is started from a thread (`asyncio.to_thread`) so the driver's event loop keeps
running meanwhile; that thread stays alive until the test's event loop closes, so the child's
parent-death signal (sent when the thread that started it exits) cannot fire early.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline_helpers import Pipeline, random_prompt
from test_pipeline_failures import Watched  # tests/pipeline's consumer of a request's events

from skippy.driver.driver import Driver
from skippy.launcher import read_events
from skippy.log import configure_logging
from skippy.protocol import TokenEvents

FAIL_WITHIN_S = 10.0  # a killed stage fails the requests in flight within this (the bound)
BACK_WITHIN_S = 60.0  # a restarted stage is serving again within this (bounded wait, not a timing claim)


async def decoding(driver: Driver, n: int, max_tokens: int = 400) -> list[Watched]:
    """n requests submitted and each seen producing tokens (bounded wait)."""
    watched = [Watched(driver.submit(random_prompt(6 + 3 * i, 700 + i, 400), max_tokens=max_tokens)) for i in range(n)]
    await asyncio.wait_for(asyncio.gather(*(w.started.wait() for w in watched)), 60.0)
    assert all(not w.task.done() for w in watched), "a request ended before the stage was killed"
    return watched


async def failed_naming(watched: list[Watched], stage_id: str) -> list[TokenEvents]:
    """Every watched request ends with an error naming `stage_id` within FAIL_WITHIN_S."""
    finals = await asyncio.wait_for(asyncio.gather(*(w.task for w in watched)), FAIL_WITHIN_S)
    for final in finals:
        assert final.finish_reason == "error" and final.error and stage_id in final.error, final
    return finals


async def completed(watched: list[Watched], timeout_s: float = BACK_WITHIN_S) -> list[TokenEvents]:
    """Every watched request completes by length (paused by a dead stage, then replayed) within a bounded wait."""
    finals = await asyncio.wait_for(asyncio.gather(*(w.task for w in watched)), timeout_s)
    for final in finals:
        assert final.finish_reason == "length", final
    return finals


async def restart_stage(pipe: Pipeline, index: int) -> None:
    """Start stage `index` of `pipe` again (its config and topology), waiting for its ready line."""
    await asyncio.to_thread(pipe.stages.start_stage, index)


async def start_rogue(pipe: Pipeline, name: str, config: Path, topology: Path) -> None:
    """Start a stage process named `name` from another config / topology (same endpoints)."""
    await asyncio.to_thread(pipe.stages.start_process, name,
                            ["stage", "--config", str(config), "--topology", str(topology)])


async def until(condition: Callable[[], bool], what: str, timeout_s: float = BACK_WITHIN_S) -> None:
    """Bounded poll of `condition` (the driver's state changes in this event loop)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {timeout_s:g} s"
        await asyncio.sleep(0.05)  # poll interval of a bounded poll


def serving(driver: Driver) -> bool:
    """Stage 0 serves again: no stage dead, no greeting pending."""
    return driver.liveness.dead is None and driver.inbound_handler.greeting is None


def edited_json(source: Path, target: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the JSON file `source` at `target` with `edit` applied."""
    data = json.loads(source.read_text())
    edit(data)
    target.write_text(json.dumps(data, indent=2))
    return target


def events_named(pipe: Pipeline, name: str, event: str) -> list[dict[str, Any]]:
    return [e for e in pipe.events(name) if e.get("event") == event]


@contextlib.contextmanager
def driver_log(path: Path) -> Iterator[Callable[[str], list[dict[str, Any]]]]:
    """While inside, this process's stderr is `path`: a driver created inside (`running_driver` sets its log
    up on stderr) logs there. Yields a reader of its events by name; logging goes back to the real stderr
    on exit (never left on a stream that is closed)."""
    try:
        with path.open("a") as out, contextlib.redirect_stderr(out):
            yield lambda event: [e for e in read_events(path) if e.get("event") == event]
    finally:
        configure_logging("summary", stage_id="stage0", role="test-driver")
