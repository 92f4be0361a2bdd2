"""Pulsar's flavour of the shared protocol errors.

The classes here are the neutral ones of ``sluice.protocols.errors`` plus the
Pulsar ``ServerError`` code a proxy standing in for a broker answers with.
Code that does not care about the protocol catches the neutral base classes.
"""

from __future__ import annotations

from sluice.protocols import errors as neutral
from sluice.protocols.errors import Problem
from sluice.protocols.pulsar import pulsar_api_pb2 as pb

__all__ = ["LocalProtocolError", "Problem", "ProtocolError", "RemoteProtocolError"]


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


class ProtocolError(neutral.ProtocolError):
    """A violation of the Pulsar wire protocol."""

    @property
    def server_error(self) -> pb.ServerError.ValueType:
        """The ``ServerError`` value to answer the offending frame with."""
        return _SERVER_ERROR[self.problem]

    @property
    def server_error_name(self) -> str:
        return pb.ServerError.Name(self.server_error)


class RemoteProtocolError(ProtocolError, neutral.RemoteProtocolError):
    """The peer sent bytes that break the Pulsar protocol."""


class LocalProtocolError(ProtocolError, neutral.LocalProtocolError):
    """We were asked to emit something that would break the Pulsar protocol."""
