"""Waiting for a condition with a deadline: the tests' one way to poll.

Here rather than in reliability.py, which loads the Pulsar client and the
embedded broker: a unit test that waits for a counter should not need them,
and the trio form has no place among the reliability tests' processes."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
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


def wait_for_text(
    process: subprocess.Popen[bytes], log: Path, text: str, timeout: float, what: str
) -> str:
    """Wait until the file ``log`` (a running process's output) holds
    ``text``, and return what it holds; fail at once, with the log's end,
    if the process ends first."""

    def said() -> str | None:
        held = log.read_text(errors="replace")
        if text in held:
            return held
        assert process.poll() is None, f"ended before {what}: {held[-2000:]}"
        return None

    return wait_until(said, timeout, what, step=0.05)
