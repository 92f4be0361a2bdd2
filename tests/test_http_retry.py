"""When Sluice sends a request again on a new broker connection: a kept
connection that fails without an answer. Sluice's HTTP listener in process
(no process started), in front of a web service of the test's own on
loopback that decides per connection whether it answers.

A request whose method is idempotent goes again; a POST, which the broker
may have carried out before its connection failed (a cursor reset, a
``skip/{n}``), does not (RFC 9112 9.3.1): its client gets a 502. A kept
connection the broker closed while it was idle still carries nothing: a
POST then goes on a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from sluice.protocols.http import replayable
from tests.test_http_relay import Upstream, relay

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class Failing(Upstream):
    """Answers every request, except the second one on a connection when
    ``hang_up_unanswered``: read whole, then the connection is closed. With
    ``close_idle``, each connection is closed right after its first answer
    (``idle_closed`` set then), as a broker closes an idle one."""

    hang_up_unanswered: bool = True
    close_idle: bool = False
    idle_closed: trio.Event = field(default_factory=trio.Event)
    requests: list[bytes] = field(default_factory=list)

    async def _one(self, stream: trio.SocketStream) -> None:
        buffer = b""
        served = 0
        async with stream:
            with trio.move_on_after(10):
                while True:
                    while b"\r\n\r\n" not in buffer:
                        data = await stream.receive_some(65536)
                        if not data:
                            return
                        buffer += data
                    head, _, buffer = buffer.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(buffer) < length:
                        buffer += await stream.receive_some(65536)
                    buffer = buffer[length:]
                    self.requests.append(head.split(b"\r\n", 1)[0])
                    served += 1
                    if served == 2 and self.hang_up_unanswered:
                        return  # carried out, never answered
                    await stream.send_all(OK)
                    if self.close_idle:
                        stream.socket.close()
                        self.idle_closed.set()
                        return


async def two_requests(upstream: Failing, second: bytes) -> bytes:
    """A GET, then ``second`` on the same client connection (so on Sluice's
    kept broker connection); what the client got for the second."""
    async with relay(upstream) as (_, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            with trio.fail_after(5):
                while not got.endswith(b"ok"):
                    got += await stream.receive_some(65536)
            if upstream.close_idle:
                await upstream.idle_closed.wait()
            await stream.send_all(second)
            return await whole_answer(stream)


async def whole_answer(stream: trio.SocketStream) -> bytes:
    """One answer, its head and its body by Content-Length."""
    answer = b""
    with trio.fail_after(5):
        while True:
            head, _, body = answer.partition(b"\r\n\r\n")
            if _ and len(body) >= int(head.lower().split(b"content-length:")[1].split()[0]):
                return answer
            chunk = await stream.receive_some(65536)
            assert chunk, answer
            answer += chunk


SKIP = (
    b"POST /admin/v2/persistent/public/default/t/subscription/s/skip/10 HTTP/1.1\r\n"
    b"Host: x\r\nContent-Length: 0\r\n\r\n"
)


async def test_a_post_the_broker_left_unanswered_is_not_sent_again() -> None:
    upstream = Failing(lambda head: OK)
    answer = await two_requests(upstream, SKIP)
    posts = [r for r in upstream.requests if r.startswith(b"POST")]
    assert len(posts) == 1, upstream.requests  # skipped 10 messages, not 20
    assert answer.startswith(b"HTTP/1.1 502 "), answer
    assert b"gave no answer" in answer


async def test_an_idempotent_request_left_unanswered_goes_again() -> None:
    upstream = Failing(lambda head: OK)
    answer = await two_requests(
        upstream, b"PUT /admin/v2/tenants/t HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert [r for r in upstream.requests if r.startswith(b"PUT")] == [
        b"PUT /admin/v2/tenants/t HTTP/1.1"
    ] * 2
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer


async def test_a_post_after_the_broker_closed_the_idle_connection_goes_on_a_new_one() -> None:
    upstream = Failing(lambda head: OK, hang_up_unanswered=False, close_idle=True)
    answer = await two_requests(upstream, SKIP)
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer
    assert [r for r in upstream.requests if r.startswith(b"POST")] == [SKIP.split(b"\r\n")[0]]


def test_which_methods_are_sent_again() -> None:
    for method in (b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"get"):
        assert replayable(method), method
    for method in (b"POST", b"PATCH", b"CONNECT"):
        assert not replayable(method), method
