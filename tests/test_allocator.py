"""glibc's thresholds raised at the proxy's start (sluice/proxy/allocator.py):
a thread that takes and frees buffers of a few hundred KiB no longer faults
their pages in afresh each time, and a user's own settings win."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sluice.proxy.allocator import (
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    MMAP_THRESHOLD,
    TRIM_THRESHOLD,
    wanted,
)

# A thread's page faults over 300 buffers of 200 KiB to 1.4 MiB, written
# whole (as a read fills its buffer), each freed before the next.
FAULTS = textwrap.dedent(
    """
    import resource, sys, threading
    from sluice.proxy.allocator import keep_big_buffers
    if sys.argv[1] == "keep":
        assert keep_big_buffers({}) == 2
    def work():
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for i in range(300):
            buffer = bytearray(200_000 + (i * 7919 % 13) * 100_000)
            del buffer
        print(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    """
)


def thread_faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.e2e  # a process of its own: mallopt is process-wide
def test_buffers_a_thread_frees_are_kept_for_the_next() -> None:
    default, kept = thread_faults("default"), thread_faults("keep")
    # About 1,700 faults against about 340 on this VM's glibc 2.36.
    assert kept * 3 < default, (kept, default)


def test_thresholds_a_user_set_are_left_alone() -> None:
    both = [(M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD)]
    assert wanted({}) == both
    assert wanted({"MALLOC_TRIM_THRESHOLD_": "0"}) == both[:1]
    assert wanted({"MALLOC_MMAP_THRESHOLD_": "65536"}) == both[1:]
    tunables = "glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=0"
    assert wanted({"GLIBC_TUNABLES": tunables}) == both[:1]
    assert wanted({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == both
