"""The compiled relay step (rust/src/step.rs) fails on a socket as the
Python path does: a read or write that fails raises (or hands back) the
OSError ``os.read`` / ``os.write`` raise on the same socket, with its errno
and its words, so that the relay logs and handles a lost connection the
same way whichever path read it."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.protocols.pulsar.decoder import COMPILED


def _step() -> Any:
    assert COMPILED is not None, "needs the compiled frame path (not SLUICE_FRAMES=python)"
    from sluice._frames import Figures, SendTable, Step

    bounds = [0.001, float("inf")]
    return Step(SendTable(), {}, {}, Figures(bounds, bounds), 1 << 20, "SEND")


@contextmanager
def _reset_socket() -> Iterator[socket.socket]:
    """A non-blocking TCP socket whose peer reset the connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        peer = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
    with ours:
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()  # an RST, not a FIN
        ours.setblocking(False)
        yield ours


def _read_error(fd: int) -> OSError:
    with pytest.raises(OSError) as caught:
        os.read(fd, 1024)
    return caught.value


def _same(got: BaseException, expected: OSError) -> None:
    assert isinstance(got, OSError)
    assert (type(got), got.errno, got.strerror, str(got)) == (
        type(expected),
        expected.errno,
        expected.strerror,
        str(expected),
    )


def test_a_read_of_a_reset_connection_fails_as_os_read_does() -> None:
    with _reset_socket() as python_side, _reset_socket() as compiled_side:
        expected = _read_error(python_side.fileno())
        assert expected.errno is not None
        sink, other = socket.socketpair()
        with sink, other, pytest.raises(OSError) as caught:
            _step().carry(compiled_side.fileno(), sink.fileno(), True, 0.0)
        _same(caught.value, expected)


def test_a_write_to_a_closed_peer_is_handed_back_as_os_write_fails() -> None:
    flow = encode(command(Type.Value("FLOW"), pb.CommandFlow(consumer_id=1, messagePermits=10)))
    # The Python path's write, to a socket whose peer is gone.
    sink, gone = socket.socketpair()
    gone.close()
    with sink, pytest.raises(OSError) as caught:
        os.write(sink.fileno(), flow)
    expected = caught.value
    assert expected.errno is not None
    source, writer = socket.socketpair()
    sink, gone = socket.socketpair()
    gone.close()
    with source, writer, sink:
        source.setblocking(False)
        writer.sendall(flow)
        got = _step().carry(source.fileno(), sink.fileno(), True, 0.0)
    assert isinstance(got, tuple)
    read, rest, error, _seconds = got
    assert (read, rest) == (len(flow), b"")
    _same(error, expected)
