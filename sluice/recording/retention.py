"""A recording directory in bounded space: ``--record-retain-bytes`` and
``--record-retain-age``.

The oldest whole recording files go first (by their last write, then by
name; a capture's files in a directory in the order of their numbers, as a
wall clock set back can make their last-write times lie), snapshots' files
included; a snapshot directory left empty goes with
its last file; what is not a regular file (a symlink, a FIFO) is neither
counted nor removed. A file being written is never removed: every writer holds a
shared ``flock`` on its open file, and a file whose exclusive lock cannot be
taken here is skipped (its writer may be another worker of the same proxy,
or another proxy on the same volume).

The size bound is kept by reservation. A writer may write a *quantum* of
bytes after a pass that left room for every writer's quantum (what is left,
plus ``headroom``, fits ``max_bytes``); before writing more it runs another
pass. Each writer's unspent quantum is at most a quantum, whatever the
others do meanwhile, so the directory never holds more than ``max_bytes``
at any moment, passes running concurrently in several processes included.
Files rotate at ``file_cap`` (at most a quarter of the budget, shared among
the writers), so that old whole files can make the room.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from sluice.recording.format import recordings_below

log = logging.getLogger("sluice.recorder")


# The least a writer may write between two passes: a file's header and
# some frames. A smaller --record-retain-bytes is refused at start.
MIN_QUANTUM = 64 * 1024


@dataclass(frozen=True)
class Retention:
    max_bytes: int | None = None
    max_age: float | None = None  # seconds since a file's last write

    def file_cap(self, max_file_bytes: int, writers: int) -> int:
        """The size at which a writer starts a new file, under this budget."""
        quantum = self.quantum(writers)
        return max_file_bytes if quantum is None else max(1, min(max_file_bytes, quantum))

    def quantum(self, writers: int) -> int | None:
        """What a writer of files may write between two passes (None: no
        size bound): a quarter of the budget, shared among the writers."""
        return None if self.max_bytes is None else self.max_bytes // (4 * max(1, writers))

    def fits(self, removed: Removed, headroom: int) -> bool:
        """Whether a pass that left ``removed.left`` made ``headroom`` of room."""
        return self.max_bytes is None or removed.left + headroom <= self.max_bytes


@dataclass
class Removed:
    files: int = 0
    bytes: int = 0
    left: int = 0  # the bytes of the files left, as listed by the pass


def enforce(
    directory: Path,
    retention: Retention,
    *,
    headroom: int,
    now: float,
    keep: Path | None = None,
) -> Removed:
    """One pass over ``directory``: remove the oldest files until what is
    left plus ``headroom`` fits ``max_bytes`` and nothing is older than
    ``max_age``. Never ``keep`` nor a file another writer holds."""
    removed = Removed()
    entries: list[tuple[float, str, Path, int]] = []
    for path in recordings_below(directory):
        try:
            st = path.lstat()
        except OSError:  # removed meanwhile
            continue
        if not stat.S_ISREG(st.st_mode):
            # Not a file a recorder wrote (a symlink, a FIFO): it takes no
            # room that removing it would make, and opening it to test its
            # lock could follow it or block.
            continue
        entries.append((st.st_mtime, path.name, path, st.st_size))
    entries = _in_writing_order(entries)
    total = sum(size for *_, size in entries)
    budget = None if retention.max_bytes is None else max(0, retention.max_bytes - headroom)
    for mtime, _, path, size in entries:
        too_big = budget is not None and total > budget
        too_old = retention.max_age is not None and now - mtime > retention.max_age
        if not (too_big or too_old):
            break
        if path == keep or _held(path):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("recording retention: cannot remove %s: %s", path, exc)
            continue
        log.debug("recording retention: removed %s (%d bytes)", path, size)
        total -= size
        removed.files += 1
        removed.bytes += size
        parent = path.parent
        if parent != directory:
            with contextlib.suppress(OSError):  # not empty yet: kept
                parent.rmdir()
    removed.left = total
    return removed


_NAME = re.compile(r"sluice-\d{8}T\d{6}-(?P<capture>[0-9a-f]+)-(?P<number>\d+)\.sluice")


def _in_writing_order(
    entries: list[tuple[float, str, Path, int]],
) -> list[tuple[float, str, Path, int]]:
    """The files oldest first, by their last write; but a writer's files in
    one directory (a capture's segments, a snapshot's files) in the order
    their numbers say it wrote them, taking their last-write times in that
    order: a wall clock set back must not make a capture's older segments
    look newer than those written since (kept while the newer go, or kept
    past --record-retain-age until the clock catches up)."""
    groups: dict[tuple[Path, str], list[tuple[int, int]]] = {}  # -> (number, position)
    for at, (_, name, path, _) in enumerate(entries):
        if (match := _NAME.fullmatch(name)) is not None:
            groups.setdefault((path.parent, match["capture"]), []).append(
                (int(match["number"]), at)
            )
    ordered = list(entries)
    for members in groups.values():
        times = sorted(entries[at][0] for _, at in members)
        for mtime, (_, at) in zip(times, sorted(members), strict=True):
            _, name, path, size = entries[at]
            ordered[at] = (mtime, name, path, size)
    ordered.sort()
    return ordered


def hold(fd: int) -> None:
    """Mark an open recording file as being written (until it is closed).
    Blocking: a retention pass holds its exclusive lock only for a moment,
    and a file left unmarked could be removed while it is written."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_SH)


def _held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return True  # cannot tell: keep it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the lock just taken
    return False
