"""Port-per-broker's journal (``--broker-ports-file``) against what a file
on disk can hold: one that cannot be written, damaged lines, ports the
proxy does not listen on."""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.addresses import Address
from sluice.errors import ConfigError
from sluice.proxy.shared import SharedBrokerPorts, check_ports_file
from tests.helpers.support import SLUICE

# linux/fs.h: the inode flags (chattr's), and the immutable one.
FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


def _set_immutable(path: Path, on: bool) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        flags[0] = flags[0] | FS_IMMUTABLE_FL if on else flags[0] & ~FS_IMMUTABLE_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags, True)
    finally:
        os.close(fd)


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[Path]:
    """``path``, a file nobody may open for writing: read-only, or for root
    immutable (``chattr +i``, as a file on a read-only mount)."""
    path.write_text("")
    if os.geteuid() != 0:
        path.chmod(0o400)
        yield path
        return
    try:
        _set_immutable(path, True)
    except OSError as exc:
        pytest.fail(f"root, and no immutable files here ({exc}): no file root cannot write")
    try:
        yield path
    finally:
        _set_immutable(path, False)


def test_a_ports_file_that_cannot_be_written_is_one_line_naming_it(tmp_path: Path) -> None:
    with unwritable(tmp_path / "broker-ports") as path:
        with pytest.raises(ConfigError, match=f"--broker-ports-file {path}: cannot open it"):
            check_ports_file(path)
        # Opened by a proxy (a worker) all the same: the same line, not a traceback.
        with pytest.raises(ConfigError, match=f"--broker-ports-file {path}") as caught:
            SharedBrokerPorts(path)
        assert "\n" not in str(caught.value)
    missing = tmp_path / "new-ports"  # a file that is not there yet is created
    check_ports_file(missing)
    assert missing.is_file()


def test_workers_give_no_port_from_a_line_outside_the_range(tmp_path: Path) -> None:
    """A worker's journal ignores a damaged line (a port over 65535) and one
    outside --listener-ports: the broker is given a port of the pool, never
    the line's."""
    path = tmp_path / "broker-ports"
    path.write_text("99999 node-1 9000 plain\n19050 node-2 9000 plain\n"
                    "1900² node-3 9000 plain\n19004 node-4 9000 plain\n")  # fmt: skip
    ports = SharedBrokerPorts(path, span=(19000, 19005))
    pool = [19000, 19001, 19002]
    assert ports.assign(Address("node-1", 9000), pool) == 19000
    assert ports.assign(Address("node-2", 9000), pool) == 19001
    # A digit int() refuses is a damaged line too, and the lines after it
    # are still read: node-4 keeps its port, nobody else gets it.
    assert ports.assign(Address("node-3", 9000), pool) == 19002
    assert ports.broker_for(19004) == (Address("node-4", 9000), "plain")
    assert ports.broker_for(19050) is None and ports.broker_for(99999) is None


def test_a_line_a_crash_tore_does_not_take_the_next_line_with_it(tmp_path: Path) -> None:
    """A crash (or a full disk) left the last line without its newline: the
    next broker's line was written onto it, and the whole was ignored as
    damaged, so that broker's port was kept by nobody, and a restart could
    give it to another broker while clients still dialled it for this one."""
    path = tmp_path / "broker-ports"
    path.write_text("19000 node-1 9000 plain\n19003 node-2 9000 pl")  # torn
    ports = SharedBrokerPorts(path, span=(19000, 19005))
    assert ports.assign(Address("node-3", 9000), [19001, 19002]) == 19001
    again = SharedBrokerPorts(path, span=(19000, 19005))  # a restart reads the file
    assert again.broker_for(19001) == (Address("node-3", 9000), "plain")
    assert again.broker_for(19000) == (Address("node-1", 9000), "plain")
    assert again.broker_for(19003) is None  # the torn line, ignored on its own


@pytest.mark.e2e  # runs the command
def test_sluice_proxy_says_a_ports_file_it_cannot_write_before_it_starts(tmp_path: Path) -> None:
    """Said where the configuration is checked: one line, exit 2, before any
    listener or worker (each worker failed on it, restarted, failed again)."""
    with unwritable(tmp_path / "broker-ports") as path:
        done = subprocess.run(
            [*SLUICE, "proxy", "--broker", "cursus://127.0.0.1:1", "--listen", "127.0.0.1:0",
             "--listener-ports", "20000-20010", "--broker-ports-file", str(path),
             "--no-check-broker"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"sluice proxy: --broker-ports-file {path}: cannot open it for reading and writing: "
        "Operation not permitted"
    ], done.stderr
