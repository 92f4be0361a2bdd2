"""The Pulsar wire protocol as pure code: no sockets, no trio.

Decode with ``FrameDecoder`` (incremental) or ``decode_frame``/``decode_stream``;
build frames with ``command`` + ``encode``/``encode_payload``; look inside
payloads with ``sluice.protocols.pulsar.payload``. The schema is ``pulsar_api.proto`` and
its generated module ``pulsar_api_pb2`` (imported here as ``pb``).
"""

from sluice.protocols.pulsar import pulsar_api_pb2 as pb
from sluice.protocols.pulsar.decoder import (
    CLOSED,
    NEED_DATA,
    FrameDecoder,
    decode_frame,
    decode_stream,
    max_frame_size,
)
from sluice.protocols.pulsar.encoder import (
    command,
    encode,
    encode_payload,
    error_reply,
    own_frame,
)
from sluice.protocols.pulsar.errors import (
    LocalProtocolError,
    Problem,
    ProtocolError,
    RemoteProtocolError,
)
from sluice.protocols.pulsar.frame import (
    DEFAULT_MAX_MESSAGE_SIZE,
    FRAME_PADDING,
    PAYLOAD_TYPES,
    Frame,
    Type,
    command_name,
)

__all__ = [
    "CLOSED",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "FRAME_PADDING",
    "NEED_DATA",
    "PAYLOAD_TYPES",
    "Frame",
    "FrameDecoder",
    "LocalProtocolError",
    "Problem",
    "ProtocolError",
    "RemoteProtocolError",
    "Type",
    "command",
    "command_name",
    "decode_frame",
    "decode_stream",
    "encode",
    "encode_payload",
    "error_reply",
    "max_frame_size",
    "own_frame",
    "pb",
]
