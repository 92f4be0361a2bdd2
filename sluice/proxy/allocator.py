"""The proxy asks glibc's allocator to keep the memory of large buffers.

Every read asks for 256 KiB, and a batch frame is often hundreds of KiB.
Under glibc's defaults, such a buffer is mapped afresh, or placed in memory
the allocator has just handed back to the kernel (it trims a heap, or
``madvise``s a thread's arena, as soon as the top of it is free). Either
way, each of its pages faults in on first touch, once per buffer.
Producing 1 KiB Cursus messages through the proxy, page faults took about
a third of the proxy's CPU.

So the proxy raises two thresholds at start: buffers up to ``MMAP_THRESHOLD``
come from the heap, and a heap keeps up to ``TRIM_THRESHOLD`` bytes free at
its top for the next buffer. Memory held stays bounded by what the
traffic's peak needed, plus that much per arena.

A user's own ``MALLOC_*_`` variables or ``GLIBC_TUNABLES`` win: nothing is
changed for a threshold they set. On a C library other than glibc (no
``mallopt``), nothing is changed.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping

log = logging.getLogger("sluice.proxy")

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 4 * 1024 * 1024
TRIM_THRESHOLD = 16 * 1024 * 1024

# Each threshold: (mallopt parameter, value, the variables that set it).
_SETTINGS = (
    (M_MMAP_THRESHOLD, MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"),
    (M_TRIM_THRESHOLD, TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold"),
)


def wanted(environ: Mapping[str, str]) -> list[tuple[int, int]]:
    """The (parameter, value) pairs to set: those the environment leaves alone."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    return [
        (parameter, value)
        for parameter, value, variable, tunable in _SETTINGS
        if variable not in environ and f"{tunable}=" not in tunables
    ]


def keep_big_buffers(environ: Mapping[str, str] = os.environ) -> int:
    """Raise glibc's mmap and trim thresholds (see above); how many were set."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in this C library: allocator left at its defaults")
        return 0
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = 0
    for parameter, value in wanted(environ):
        if mallopt(parameter, value) == 1:
            done += 1
        else:
            log.debug("mallopt(%d, %d) refused", parameter, value)
    return done
