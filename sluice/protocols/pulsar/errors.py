"""Typed protocol errors.

Every problem the codec finds is one of these. Each carries the Pulsar
``ServerError`` code a proxy standing in for a broker should answer with, and
whether framing itself is lost (``fatal``): after a fatal error the byte stream
cannot be trusted any more and the connection has to close.

``RemoteProtocolError`` is about bytes a peer sent us; ``LocalProtocolError``
is about something we were asked to send (an encoder given an invalid frame).
"""

from __future__ import annotations

import enum

from sluice.protocols.pulsar import pulsar_api_pb2 as pb


class Problem(enum.Enum):
    """What is wrong with a frame. The value is the label used in metrics."""

    TOO_LARGE = "size"  # frame exceeds the negotiated maximum
    FRAMING = "framing"  # sizes inside the frame contradict each other
    PARSE = "parse"  # a protobuf section does not parse
    MISSING_FIELD = "missing-field"  # a required field (or the typed body) is absent
    CHECKSUM = "checksum"  # CRC32-C over metadata + payload does not match
    UNKNOWN_TYPE = "unknown-type"  # a command type this schema does not know
    TRAILING = "trailing"  # bytes left over inside a frame
    TRUNCATED = "truncated"  # the stream ended in the middle of a frame


# What a broker would answer with for each problem.
_SERVER_ERROR: dict[Problem, pb.ServerError.ValueType] = {
    Problem.TOO_LARGE: pb.NotAllowedError,
    Problem.FRAMING: pb.UnknownError,
    Problem.PARSE: pb.UnknownError,
    Problem.MISSING_FIELD: pb.UnknownError,
    Problem.CHECKSUM: pb.ChecksumError,
    Problem.UNKNOWN_TYPE: pb.NotAllowedError,
    Problem.TRAILING: pb.UnknownError,
    Problem.TRUNCATED: pb.UnknownError,
}


class ProtocolError(Exception):
    """A violation of the Pulsar wire protocol."""

    def __init__(self, problem: Problem, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.problem = problem
        self.message = message
        self.fatal = fatal

    @property
    def server_error(self) -> pb.ServerError.ValueType:
        """The ``ServerError`` value to answer the offending frame with."""
        return _SERVER_ERROR[self.problem]

    @property
    def server_error_name(self) -> str:
        return pb.ServerError.Name(self.server_error)

    def __repr__(self) -> str:
        fatal = ", fatal" if self.fatal else ""
        return f"{type(self).__name__}({self.problem.value}: {self.message}{fatal})"


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol."""


class LocalProtocolError(ProtocolError):
    """We were asked to emit something that would break the protocol."""
