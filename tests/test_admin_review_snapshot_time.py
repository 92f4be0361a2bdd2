"""A snapshot that takes longer to write than an admin request may take
(a large ring, a slow volume) is still answered: before, the request's
10 s ran out while the file was being written, the caller got no answer
(and asked again: a second capture of the same moment), and the snapshot,
written whole, went uncounted."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry

from sluice.addresses import Address
from sluice.proxy import admin
from sluice.proxy.admin import SnapshotEndpoint, bound, open_admin, serve_admin
from sluice.recording.format import PayloadPolicy, recording_files
from sluice.recording.writer import Recorder, RecorderConfig

TOKEN = "snapshot-time-token"


async def test_a_snapshot_slower_than_a_request_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin, "TIMEOUT", 0.5)  # a request's time, shortened for the test
    recorder = Recorder(RecorderConfig(tmp_path, PayloadPolicy.FULL, ring_bytes=1 << 20))
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    write_in_thread = recorder._io

    async def slow_io(fn: Any, *args: Any) -> Any:  # a disk slower than the request's time
        await trio.sleep(1.0)
        return await write_in_thread(fn, *args)

    recorder._io = slow_io  # type: ignore[method-assign]
    listeners = await open_admin(Address("127.0.0.1", 0))
    address = bound(listeners)
    endpoint = SnapshotEndpoint(recorder, TOKEN)
    body = b'{"reason": "slow"}'
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        nursery.start_soon(functools.partial(
            serve_admin, listeners, CollectorRegistry(), list, {"/recording": endpoint}
        ))  # fmt: skip
        stream = await trio.open_tcp_stream(address.host, address.port)
        await stream.send_all(
            f"POST /recording/snapshot HTTP/1.1\r\nHost: {address}\r\n".encode()
            + b"Authorization: Bearer "
            + TOKEN.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
            + body
        )  # fmt: skip
        answer = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(4096):
                answer += chunk
        await stream.aclose()
        nursery.cancel_scope.cancel()
    assert answer.startswith(b"HTTP/1.1 201 Created"), answer
    assert len(recording_files(tmp_path)) == 1
    assert recorder.snapshots_total == {"on_demand": 1}
