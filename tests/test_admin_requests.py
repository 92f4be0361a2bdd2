"""The admin endpoint's request reader: what it refuses before any handler
sees the request."""

from __future__ import annotations

import pytest
import trio.testing

from sluice.proxy.admin import AdminRequest, Refused, _read_request


async def _read(raw: bytes) -> AdminRequest | None:
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(raw)
    return await _read_request(server)  # type: ignore[arg-type]


async def test_a_chunked_body_is_refused_not_taken_for_none() -> None:
    # Its body was read as empty: POST /recording/snapshot with a chunked
    # {"last": 30} wrote the whole ring, the caller's fields ignored.
    body = b'{"last": 30}'
    raw = (
        b"POST /recording/snapshot HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n"
    )
    with pytest.raises(Refused) as info:
        await _read(raw)
    assert info.value.status == 400 and "Content-Length" in info.value.message


async def test_a_body_with_content_length_is_read() -> None:
    request = await _read(b"POST /faults HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
    assert request is not None and request.body == b"{}"
