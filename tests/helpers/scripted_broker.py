"""A scripted broker for the behaviours pulsar-lite never produces.

Only the discovery side: it answers CONNECT, PING, PARTITIONED_METADATA
(not partitioned) and LOOKUP as its ``on_lookup`` script says. Everything
else about brokers is tested against the real pulsar-lite.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from sluice.protocols.pulsar import ProtocolError, Type, command, encode, pb
from sluice.proxy.pulsar import FrameStream

LookupScript = Callable[[pb.CommandLookupTopic], Awaitable[pb.CommandLookupTopicResponse]]


class ScriptedBroker:
    def __init__(self, on_lookup: LookupScript) -> None:
        self.on_lookup = on_lookup
        self.port = 0
        self.lookups: list[pb.CommandLookupTopic] = []

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = FrameStream(stream)
        async with trio.open_nursery() as nursery:
            try:
                while (frame := await conn.receive_frame()) is not None:
                    t = frame.type
                    if t == Type.Value("CONNECT"):
                        connected = pb.CommandConnected(
                            server_version="scripted", protocol_version=21
                        )
                        await conn.send(encode(command(Type.Value("CONNECTED"), connected)))
                    elif t == Type.Value("PING"):
                        await conn.send(encode(command(Type.Value("PONG"))))
                    elif t == Type.Value("PARTITIONED_METADATA"):
                        answer = pb.CommandPartitionedTopicMetadataResponse(
                            request_id=frame.body.request_id, partitions=0
                        )
                        answer.response = answer.Success
                        await conn.send(
                            encode(command(Type.Value("PARTITIONED_METADATA_RESPONSE"), answer))
                        )
                    elif t == Type.Value("LOOKUP"):
                        nursery.start_soon(self._lookup, conn, frame.body)
            except (trio.BrokenResourceError, ProtocolError):
                pass
            nursery.cancel_scope.cancel()

    async def _lookup(self, conn: FrameStream, request: pb.CommandLookupTopic) -> None:
        self.lookups.append(request)
        answer = await self.on_lookup(request)
        answer.request_id = request.request_id
        await conn.send(encode(command(Type.Value("LOOKUP_RESPONSE"), answer)))


def connect_to(url: str) -> pb.CommandLookupTopicResponse:
    answer = pb.CommandLookupTopicResponse(brokerServiceUrl=url, authoritative=True, request_id=0)
    answer.response = answer.Connect
    return answer


def redirect_to(url: str) -> pb.CommandLookupTopicResponse:
    answer = pb.CommandLookupTopicResponse(brokerServiceUrl=url, authoritative=True, request_id=0)
    answer.response = answer.Redirect
    return answer


def failed(error: int, message: str) -> pb.CommandLookupTopicResponse:
    answer = pb.CommandLookupTopicResponse(request_id=0, error=error, message=message)  # type: ignore[arg-type]
    answer.response = answer.Failed
    return answer
