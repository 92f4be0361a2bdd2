"""The relay thread when the process is out of file descriptors (its
``RLIMIT_NOFILE`` reached, as a busy proxy's can be): a write it would wait
for itself (``Relay._write_later``, which watches a duplicate of the
socket) goes to trio instead, which needs no new descriptor, and the
connection relays on as before."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from sluice.protocols.core import Taps
from sluice.protocols.pulsar import Frame
from sluice.proxy.metrics import Metrics
from sluice.proxy.relay_thread import relay_thread
from tests.test_relay_clock import open_producer, real_socket_pair, send_frame
from tests.test_relay_thread import SIZES, QuickDial, needs_the_compiled_step, slow_broker


@contextmanager
def no_descriptor_left() -> Iterator[None]:
    """While it lasts, no new descriptor can be made (EMFILE): the soft
    limit is put at the lowest free descriptor number."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    free = os.dup(0)
    os.close(free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (free, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_writes_that_must_wait_go_on_when_no_descriptor_is_left() -> None:
    needs_the_compiled_step()
    got: list[Frame] = []
    receipts: list[int] = []
    async with relay_thread(True) as carrier, trio.open_nursery() as nursery:
        assert carrier is not None
        h = QuickDial(nursery, slow_broker(got), real_socket_pair, real_socket_pair, carrier,
                      Taps([Metrics()]))  # fmt: skip
        h.start()
        with trio.fail_after(10):
            await open_producer(h)

            async def send_all() -> None:
                for sequence, size in enumerate(SIZES):
                    await h.client.send(send_frame(sequence, bytes([sequence % 251]) * size))

            with no_descriptor_left():
                nursery.start_soon(send_all)
                while len(receipts) < len(SIZES):
                    frame = await h.client.receive()
                    assert frame is not None and frame.name == "SEND_RECEIPT", frame
                    receipts.append(frame.body.sequence_id)
            await h.client.stream.aclose()
            await h.done.wait()
        assert carrier.carried() == 0
        handed = carrier.handed_back
    expected = list(range(len(SIZES)))
    assert receipts == expected
    assert [f.body.sequence_id for f in got] == expected
    assert [f.payload for f in got] == [bytes([i % 251]) * n for i, n in enumerate(SIZES)]
    assert h.reason == "closed"
    assert handed > 1  # the writes that waited, in trio
