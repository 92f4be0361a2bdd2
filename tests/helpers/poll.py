"""Waiting for a condition with a deadline: the tests' one way to poll.

Here rather than in reliability.py, which loads the Pulsar client and the
embedded broker: a unit test that waits for a counter should not need them,
and the trio form has no place among the reliability tests' processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")


def _timed_out(timeout: float, what: str) -> AssertionError:
    return AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def wait_until(check: Callable[[], T | None], timeout: float, what: str, step: float = 0.1) -> T:
    """Call ``check`` every ``step`` seconds until it returns something true,
    and return that; after ``timeout`` seconds, fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what)
        time.sleep(step)
    return found


async def wait_until_in_trio(
    check: Callable[[], T | None], timeout: float, what: str, step: float = 0.01
) -> T:
    """``wait_until`` for a trio task: it sleeps with trio, so the tasks it
    waits on go on meanwhile."""
    with trio.move_on_after(timeout):
        while not (found := check()):
            await trio.sleep(step)
        return found
    raise _timed_out(timeout, what)
