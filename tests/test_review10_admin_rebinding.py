"""Review: the admin endpoint on loopback answers any ``Host`` (DNS rebinding).

``--admin 127.0.0.1:PORT`` keeps the endpoint to this machine's users, but
the endpoint answers a request whatever its ``Host`` names: a web page the
operator opens (``http://rebind.example:PORT/``) whose name is then pointed
at 127.0.0.1 reads, as its own origin, ``/metrics`` (topic names, rates,
clients), ``/faults`` (the rules in force) and ``/config``, none of which
needs the token. (Changing state needs the token: a page cannot send it.)
``sluice view`` refuses such a ``Host`` (sluice/view/server.py,
``_is_own_host``); the admin endpoint has no check at all.
"""

from __future__ import annotations

import functools

import pytest
import trio
from prometheus_client import CollectorRegistry, Counter

from sluice.addresses import Address
from sluice.protocols import registry
from sluice.protocols.faults import Faults
from sluice.proxy.admin import FaultsEndpoint, bound, open_admin, serve_admin


async def _get(address: Address, target: str, host: str) -> tuple[str, bytes]:
    stream = await trio.open_tcp_stream(address.host, address.port)
    try:
        await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                data += chunk
    finally:
        await stream.aclose()
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0].decode(), body


@pytest.mark.e2e  # a socket on loopback
async def test_a_loopback_admin_endpoint_answers_no_other_sites_name() -> None:
    metrics = CollectorRegistry()
    Counter("sluice_review_frames", "frames", ["topic"], registry=metrics).labels(
        "persistent://acme/payments/card-numbers"
    ).inc()
    faults = FaultsEndpoint(Faults(), registry.all_faults(), token="s3cret")
    listeners = await open_admin(Address("127.0.0.1", 0))
    address = bound(listeners)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(
            serve_admin, listeners, metrics, lambda excluded: [], {"/faults": faults},
        ))  # fmt: skip
        own = f"127.0.0.1:{address.port}"
        status, body = await _get(address, "/metrics", own)
        assert status == "HTTP/1.1 200 OK" and b"card-numbers" in body  # served as before
        for target in ("/metrics", "/faults", "/healthz"):
            status, body = await _get(address, target, f"rebind.example:{address.port}")
            assert status.split()[1] == "403", (target, status, body[:200])
            assert b"card-numbers" not in body
        nursery.cancel_scope.cancel()


@pytest.mark.e2e  # a socket on loopback
async def test_every_answer_says_its_type_is_not_to_be_sniffed() -> None:
    """An answer that repeats what was asked (``no fault rule '<script>'``)
    is never read as HTML by a browser that sniffs."""
    listeners = await open_admin(Address("127.0.0.1", 0))
    address = bound(listeners)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_admin, listeners, CollectorRegistry(), lambda excluded: [])
        stream = await trio.open_tcp_stream(address.host, address.port)
        await stream.send_all(f"GET /nowhere HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
        answer = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                answer += chunk
        nursery.cancel_scope.cancel()
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert b"\r\nx-content-type-options: nosniff" in head, head
