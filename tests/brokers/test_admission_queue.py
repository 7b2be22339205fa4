"""AdmissionQueue: immediate admission, FIFO waiting, bounded queue, timeout, cancellation, no overtaking.

Pure asyncio: tasks are let run with `settle()` (zero-length yields until a condition holds, bounded),
never with timed sleeps; the only real waiting is the admission timeout itself (50 ms).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from brokers.admission import AdmissionError, AdmissionQueue, AdmissionTimeout, Permit, QueueFull


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10.0))


async def settle(condition: Callable[[], bool] = lambda: True, max_yields: int = 100) -> None:
    """Let other tasks run (zero-length yields) until `condition()` holds."""
    for _ in range(max_yields):
        await asyncio.sleep(0)
        if condition():
            return
    raise AssertionError("condition not reached")


def at_once(coro: Coroutine[Any, Any, Permit]) -> Permit:
    """The result of a coroutine that must complete without suspending."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError("acquire suspended although a permit was free")


class Waiter:
    """A task acquiring a permit; `order` records who got one, in order."""

    def __init__(self, queue: AdmissionQueue, name: str, order: list[str]) -> None:
        self.permit: Permit | None = None
        self.task = asyncio.get_running_loop().create_task(self._run(queue, name, order))

    async def _run(self, queue: AdmissionQueue, name: str, order: list[str]) -> None:
        self.permit = await queue.acquire(name)
        order.append(name)


def test_free_permit_is_granted_without_waiting() -> None:
    async def body() -> None:
        queue = AdmissionQueue(2, 4)
        first, second = at_once(queue.acquire("a")), at_once(queue.acquire("b"))
        assert (first.request_id, second.request_id) == ("a", "b")
        assert (queue.running, queue.waiting) == (2, 0)

    run(body())


def test_waiters_are_admitted_in_arrival_order() -> None:
    async def body() -> None:
        queue, order = AdmissionQueue(1, 8), []
        held = at_once(queue.acquire("held"))
        waiters = [Waiter(queue, name, order) for name in "abcd"]
        await settle(lambda: queue.waiting == 4)
        held.release()
        for i, waiter in enumerate(waiters):
            await settle(lambda waiter=waiter: waiter.permit is not None)
            assert order == list("abcd"[: i + 1]) and (queue.running, queue.waiting) == (1, 3 - i)
            assert waiter.permit is not None
            waiter.permit.release()
        assert order == list("abcd") and (queue.running, queue.waiting) == (0, 0)

    run(body())


def test_full_queue_refuses_at_once() -> None:
    async def body() -> None:
        queue, order = AdmissionQueue(1, 2), []
        held = at_once(queue.acquire("held"))
        waiters = [Waiter(queue, name, order) for name in "ab"]
        await settle(lambda: queue.waiting == 2)
        with pytest.raises(QueueFull, match=r"generation queue full \(capacity 2\); retry later") as refused:
            at_once(queue.acquire("c"))
        assert refused.value.code == "queue_full"
        assert queue.waiting == 2  # the refused request took no slot
        held.release()
        await settle(lambda: order == ["a"])
        for waiter in waiters:
            waiter.task.cancel()

    run(body())


def test_timeout_refuses_and_frees_the_slot() -> None:
    async def body() -> None:
        queue = AdmissionQueue(1, 1, timeout_s=0.05)
        held = at_once(queue.acquire("held"))
        with pytest.raises(AdmissionTimeout, match=r"waited 0.05 s for a generation slot") as refused:
            await queue.acquire("late")
        assert refused.value.code == "admission_timeout"
        assert (queue.running, queue.waiting) == (1, 0)
        order: list[str] = []
        waiter = Waiter(queue, "next", order)  # the slot is free again: capacity 1 admits a new waiter
        await settle(lambda: queue.waiting == 1)
        held.release()
        await waiter.task
        assert order == ["next"] and queue.running == 1

    run(body())


def test_zero_timeout_waits_until_cancelled() -> None:
    async def body() -> None:
        queue = AdmissionQueue(1, 1, timeout_s=0)
        at_once(queue.acquire("held"))
        waiting = asyncio.get_running_loop().create_task(queue.acquire("w"))
        done, _ = await asyncio.wait({waiting}, timeout=0.1)  # a bounded look: still queued, no timeout
        assert not done and queue.waiting == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert queue.waiting == 0

    run(body())


def test_cancelled_waiter_frees_its_slot() -> None:
    async def body() -> None:
        queue, order = AdmissionQueue(1, 1), []
        held = at_once(queue.acquire("held"))
        first = Waiter(queue, "first", order)
        await settle(lambda: queue.waiting == 1)
        first.task.cancel()
        await asyncio.gather(first.task, return_exceptions=True)
        assert queue.waiting == 0
        second = Waiter(queue, "second", order)  # would be QueueFull if the slot were still taken
        await settle(lambda: queue.waiting == 1)
        held.release()
        await second.task
        assert order == ["second"] and queue.running == 1

    run(body())


def test_waiter_cancelled_after_being_handed_a_permit_gives_it_back() -> None:
    async def body() -> None:
        queue, order = AdmissionQueue(1, 2), []
        held = at_once(queue.acquire("held"))
        first, second = Waiter(queue, "first", order), Waiter(queue, "second", order)
        await settle(lambda: queue.waiting == 2)
        held.release()  # hands the permit to "first", whose task has not resumed yet
        first.task.cancel()
        await asyncio.gather(first.task, return_exceptions=True)
        await second.task
        assert order == ["second"] and (queue.running, queue.waiting) == (1, 0)

    run(body())


def test_no_overtaking_when_a_permit_frees_as_a_request_arrives() -> None:
    async def body() -> None:
        queue, order = AdmissionQueue(1, 4), []
        held = at_once(queue.acquire("held"))
        queued = Waiter(queue, "queued", order)
        await settle(lambda: queue.waiting == 1)
        held.release()
        late = Waiter(queue, "late", order)  # arrives in the same instant, before "queued" resumes
        await settle(lambda: queued.permit is not None)
        await settle()
        assert order == ["queued"] and late.permit is None and queue.waiting == 1
        assert queued.permit is not None
        queued.permit.release()
        await late.task
        assert order == ["queued", "late"]

    run(body())


def test_release_is_idempotent() -> None:
    async def body() -> None:
        queue, order = AdmissionQueue(1, 4), []
        held = at_once(queue.acquire("held"))
        waiters = [Waiter(queue, name, order) for name in "ab"]
        await settle(lambda: queue.waiting == 2)
        held.release()
        held.release()
        with held:  # the context manager releases too, still once
            pass
        await settle(lambda: order == ["a"])
        assert (queue.running, queue.waiting, order) == (1, 1, ["a"])
        waiters[1].task.cancel()

    run(body())


def test_concurrency_changes_admit_and_retire() -> None:
    async def body() -> None:
        queue, order = AdmissionQueue(1, 4), []
        held = at_once(queue.acquire("held"))
        waiters = [Waiter(queue, name, order) for name in "abc"]
        await settle(lambda: queue.waiting == 3)
        queue.concurrency = 3  # two more permits: the two oldest waiters get them
        await settle(lambda: len(order) == 2)
        assert order == ["a", "b"] and (queue.running, queue.waiting) == (3, 1)
        queue.concurrency = 1  # lowered: nobody is admitted until running drops below 1
        held.release()
        assert waiters[0].permit is not None
        waiters[0].permit.release()
        await settle()
        assert (queue.running, queue.waiting, order) == (1, 1, ["a", "b"])
        assert waiters[1].permit is not None
        waiters[1].permit.release()
        await waiters[2].task
        assert order == ["a", "b", "c"]

    run(body())


def test_reject_waiters_fails_every_queued_request() -> None:
    async def body() -> None:
        queue = AdmissionQueue(1, 4)
        at_once(queue.acquire("held"))
        tasks = [asyncio.get_running_loop().create_task(queue.acquire(name)) for name in "ab"]
        await settle(lambda: queue.waiting == 2)
        assert queue.reject_waiters(AdmissionError("pipeline unavailable: stage stage1 is down")) == 2
        for task in tasks:
            with pytest.raises(AdmissionError, match="stage stage1 is down") as refused:
                await task
            assert refused.value.code == "unavailable"
        assert (queue.running, queue.waiting) == (1, 0)

    run(body())
