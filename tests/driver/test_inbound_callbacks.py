"""Stage 0's helpers without a driver: `Inbound` built from its parts, against a fake `DriverCallbacks`, the launcher's own
round trips (calibration's: their predictions go to the caller, never to the driver), calibration from parts."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from skippy.config import PrefillChunkOptions
from skippy.driver.batches import BatchLauncher, InFlight
from skippy.driver.inbound import Inbound
from skippy.driver.liveness import Liveness
from skippy.driver.verify_costs import CALIBRATION_SESSION, calibrate_rows
from skippy.log import get_logger
from skippy.protocol import CacheCaps, ErrorCode, ErrorReport, Predictions, ProtocolError, Ready, StageIdentity
from skippy.stage.worker import Computed

STAGE0 = StageIdentity("stage0", 0, 0, 4, "digest", 8)


class FakeDriver:
    """What Inbound may call, recorded: the driver's callbacks, and the paused requests' (`Replays`)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_predictions(self, msg: Predictions) -> None:
        self.calls.append(("predictions", msg.batch_id))

    def fail_batch(self, batch_id: int | None, session_ids: tuple[int, ...], error: str) -> None:
        self.calls.append(("fail_batch", batch_id, session_ids, error))

    def pause_live(self, stage_id: str, error: str) -> None:
        self.calls.append(("pause_live", stage_id, error))

    def chain_back(self) -> None:
        self.calls.append(("chain_back",))

    def fail_paused(self, error: str) -> None:
        self.calls.append(("fail_paused", error))

    def expire(self) -> None:
        self.calls.append(("expire",))

    def downstream_ready(self, cache: CacheCaps | None) -> None:
        self.calls.append(("downstream_ready", cache))

    async def forget_prefixes(self) -> None:
        self.calls.append(("forget_prefixes",))


def test_inbound_reports_to_its_callbacks() -> None:
    driver, liveness = FakeDriver(), Liveness(["stage1"])
    inbound = Inbound(driver, STAGE0, get_logger(), liveness=liveness, replays=driver, downstream=None)  # type: ignore[arg-type]

    async def body() -> None:
        await inbound.dispatch(Predictions(3, ()))
        await inbound.dispatch(ErrorReport(ErrorCode.BATCH_FAILED, "boom", "stage1", 3, (5,)))
        await inbound.dispatch(Ready(StageIdentity("stage1", 1, 4, 8, "digest", 8)))
        await inbound.dispatch(ProtocolError(ErrorCode.MALFORMED, "garbled"))
        await inbound.dispatch(ErrorReport(ErrorCode.STAGE_STOPPED, "stopped", "stage1"))

    asyncio.run(body())
    assert driver.calls == [("predictions", 3), ("fail_batch", 3, (5,), "stage stage1: boom"), ("downstream_ready", None),
                            ("pause_live", "stage1", "stage stage1: stopped")]
    assert liveness.dead == "stage1"


def test_a_round_trip_batch_goes_to_its_waiter_not_the_driver() -> None:
    async def body() -> None:
        launcher = BatchLauncher(None, None, "stage0")  # type: ignore[arg-type]  # no batch is computed here
        loop = asyncio.get_running_loop()
        awaited, failed = loop.create_future(), loop.create_future()
        launcher.inflight.update({7: InFlight([], 1.0, waiter=awaited), 8: InFlight([], 1.0),
                                  9: InFlight([], 1.0, waiter=failed)})
        answer = Predictions(7, ())
        assert launcher.complete(7, answer) is None and awaited.result() is answer
        assert launcher.complete(8, Predictions(8, ())) is not None  # the driver's
        assert launcher.complete(8, Predictions(8, ())) is None  # no longer in flight
        assert launcher.complete(9) is None  # failed downstream: its waiter fails at once
        with pytest.raises(RuntimeError, match="batch 9 failed"):
            failed.result()
        assert not launcher.inflight

    asyncio.run(body())


class FakeWorker:
    """A single stage whose decode of r rows takes 2r ms."""

    async def compute(self, windows: list[Any], hidden: Any = None, verify: Any = ()) -> Computed:
        return Computed(None, (), 0.0, 2.0 * sum(w.n_tokens for w in windows))


def test_calibration_takes_parts_and_releases_its_session() -> None:
    released: list[tuple[int, ...]] = []

    async def release(session_ids: tuple[int, ...]) -> None:
        released.append(session_ids)

    launcher = BatchLauncher(FakeWorker(), None, "stage0")  # type: ignore[arg-type]
    cost = asyncio.run(calibrate_rows(launcher, PrefillChunkOptions(), 32, release, max_rows=3, repeats=1))
    assert np.allclose(cost, [0.0, 2.0, 4.0, 6.0])
    assert released == [(CALIBRATION_SESSION,)] and not launcher.inflight


class CountingWorker(FakeWorker):
    def __init__(self) -> None:
        self.calls = 0

    async def compute(self, windows: list[Any], hidden: Any = None, verify: Any = ()) -> Computed:
        self.calls += 1
        return await super().compute(windows, hidden, verify)


async def _no_release(session_ids: tuple[int, ...]) -> None:
    pass


@pytest.mark.parametrize(("budget_s", "sweeps"), [(0.0, 1), (60.0, 3)])
def test_calibration_sweeps_again_only_within_its_time_budget(budget_s: float, sweeps: int) -> None:
    worker = CountingWorker()
    launcher = BatchLauncher(worker, None, "stage0")  # type: ignore[arg-type]
    cost = asyncio.run(calibrate_rows(launcher, PrefillChunkOptions(), 32, _no_release, max_rows=3, repeats=3,
                                      budget_s=budget_s))
    assert worker.calls == 3 * sweeps and np.allclose(cost, [0.0, 2.0, 4.0, 6.0])
