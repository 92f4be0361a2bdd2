"""The admin HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``.

A deliberately small HTTP/1.1 responder on trio, sharing the proxy's event
loop (no threads): GET and HEAD only, one request per connection, request
heads capped at 8 KiB and 10 seconds. That is all Prometheus and Kubernetes
probes need.

- ``/healthz``: 200 while the process runs its event loop.
- ``/readyz``: 200 when the proxy is listening and its upstream broker
  answered the last probe; 503 with the reason otherwise.
- ``/metrics``: the Prometheus text format.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from sluice.addresses import Address

log = logging.getLogger("sluice.admin")

MAX_HEAD = 8 * 1024
TIMEOUT = 10.0
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}  # fmt: skip


async def open_admin(address: Address) -> list[trio.SocketListener]:
    """Bind the admin endpoint (raises OSError, e.g. when the port is taken)."""
    return await trio.open_tcp_listeners(address.port, host=address.host)


def bound(listeners: list[trio.SocketListener]) -> Address:
    host, port = listeners[0].socket.getsockname()[:2]
    return Address(host, port)


# What /readyz reports: the reasons the proxy is not ready (none: ready).
Readiness = Callable[[], list[str]]


async def serve_admin(
    listeners: list[trio.SocketListener], registry: CollectorRegistry, readiness: Readiness
) -> None:
    async def handle(stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(TIMEOUT):
                await _respond(stream, registry, readiness)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    await trio.serve_listeners(handle, listeners)


async def _respond(
    stream: trio.SocketStream, registry: CollectorRegistry, readiness: Readiness
) -> None:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return
        head += chunk
        if len(head) > MAX_HEAD:
            await _send(stream, 400, b"request head too large\n")
            return
    request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = request_line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        await _send(stream, 400, b"bad request\n")
        return
    method, target = parts[0], parts[1].split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        await _send(stream, 405, b"GET or HEAD only\n", extra=[("Allow", "GET, HEAD")])
        return
    body_wanted = method == "GET"
    if target == "/metrics":
        await _send(stream, 200, generate_latest(registry), CONTENT_TYPE_LATEST,
                    body_wanted=body_wanted)  # fmt: skip
    elif target == "/healthz":
        await _send(stream, 200, b"ok\n", body_wanted=body_wanted)
    elif target == "/readyz":
        problems = readiness()
        if problems:
            await _send(stream, 503, ("; ".join(problems) + "\n").encode(), body_wanted=body_wanted)
        else:
            await _send(stream, 200, b"ready\n", body_wanted=body_wanted)
    else:
        await _send(stream, 404, b"not found: try /metrics, /healthz or /readyz\n",
                    body_wanted=body_wanted)  # fmt: skip


async def _send(
    stream: trio.SocketStream,
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    *,
    body_wanted: bool = True,
    extra: list[tuple[str, str]] | None = None,
) -> None:
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
        *(extra or []),
    ]
    head = f"HTTP/1.1 {status} {_REASONS[status]}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers
    )
    await stream.send_all(head.encode("latin-1") + b"\r\n" + (body if body_wanted else b""))
