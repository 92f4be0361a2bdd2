"""The tests' one way to wait for a condition: tests/helpers/poll.py."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import trio

from tests.helpers.poll import wait_until, wait_until_in_trio


def counter(true_from: int) -> tuple[list[int], Callable[[], int]]:
    calls: list[int] = []

    def check() -> int:
        calls.append(len(calls))
        return len(calls) if len(calls) >= true_from else 0

    return calls, check


def test_the_first_true_value_is_returned_once_it_comes() -> None:
    calls, check = counter(3)
    assert wait_until(check, 5, "the third call", step=0.001) == 3
    assert len(calls) == 3


def test_a_condition_never_met_fails_naming_what_was_waited_for_and_how_long() -> None:
    calls, check = counter(10**9)
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 0\.2s waiting for the moon"):
        wait_until(check, 0.2, "the moon", step=0.05)
    assert time.monotonic() - start >= 0.2
    assert 2 <= len(calls) <= 8, calls  # polled every step, not in a busy loop


async def test_in_trio_the_first_true_value_is_returned_once_it_comes() -> None:
    calls, check = counter(3)
    assert await wait_until_in_trio(check, 5, "the third call", step=0.001) == 3
    assert len(calls) == 3


async def test_in_trio_a_condition_never_met_fails_naming_what_was_waited_for() -> None:
    calls, check = counter(10**9)
    start = trio.current_time()
    with pytest.raises(AssertionError, match=r"timed out after 0\.2s waiting for the moon"):
        await wait_until_in_trio(check, 0.2, "the moon", step=0.05)
    assert trio.current_time() - start >= 0.2
    assert 2 <= len(calls) <= 8, calls
