"""Typed protocol errors shared by every protocol's codec.

Every problem a codec finds in bytes is one of these, whatever the protocol.
``fatal`` says whether framing itself is lost: after a fatal error the byte
stream cannot be trusted any more and the connection has to close. Each
protocol package adds what a broker of its kind answers with (Pulsar: a
``ServerError`` code; Cursus: an ``ERROR:`` line) on top of these classes, so
protocol-neutral code catches ``ProtocolError`` and reads ``problem``.

``RemoteProtocolError`` is about bytes a peer sent us; ``LocalProtocolError``
is about something we were asked to send (an encoder given an invalid frame).
"""

from __future__ import annotations

import enum


class Problem(enum.Enum):
    """What is wrong with a frame. The value is the label used in metrics."""

    TOO_LARGE = "size"  # frame exceeds the negotiated maximum
    FRAMING = "framing"  # sizes inside the frame contradict each other
    PARSE = "parse"  # a section (protobuf, text command, batch) does not parse
    MISSING_FIELD = "missing-field"  # a required field (or the typed body) is absent
    CHECKSUM = "checksum"  # a checksum over the frame's contents does not match
    UNKNOWN_TYPE = "unknown-type"  # a command type this codec does not know
    TRAILING = "trailing"  # bytes left over inside a frame
    TRUNCATED = "truncated"  # the stream ended in the middle of a frame


class ProtocolError(Exception):
    """A violation of a wire protocol."""

    def __init__(self, problem: Problem, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.problem = problem
        self.message = message
        self.fatal = fatal

    def __repr__(self) -> str:
        fatal = ", fatal" if self.fatal else ""
        return f"{type(self).__name__}({self.problem.value}: {self.message}{fatal})"


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol."""


class LocalProtocolError(ProtocolError):
    """We were asked to emit something that would break the protocol."""
