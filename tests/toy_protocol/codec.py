"""Toy frames: framing, checksum and verbs."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from sluice.protocols.errors import Problem

HEAD, MAX_FRAME = struct.Struct(">II"), 1 << 16
REQUESTS, ANSWERS = frozenset({"GET", "PUT"}), frozenset({"OK", "ERR", "MOVED"})


@dataclass(frozen=True)
class Frame:
    raw: bytes
    name: str  # the verb, or INVALID
    text: str
    problem: Problem | None = None


def encode(text: str) -> bytes:
    body = text.encode()
    return HEAD.pack(4 + len(body), zlib.crc32(body)) + body


def decode(raw: bytes, from_client: bool) -> Frame:
    """One whole frame; a bad one carries its problem (never raises)."""
    size, crc = HEAD.unpack_from(raw) if len(raw) >= 8 else (0, 0)
    text = raw[8:].decode(errors="replace")
    verb = text.partition(" ")[0]
    problem = None
    if len(raw) < 8 or size != len(raw) - 4:
        problem = Problem.FRAMING
    elif zlib.crc32(raw[8:]) != crc:
        problem = Problem.CHECKSUM
    elif verb not in (REQUESTS if from_client else ANSWERS):
        problem = Problem.UNKNOWN_TYPE
    return Frame(raw, "INVALID" if problem else verb, text, problem)


def split(buffer: bytearray) -> list[bytes]:
    """The whole frames at the start of ``buffer``, taken out of it."""
    out = []
    while len(buffer) >= 4 and len(buffer) >= 4 + (size := int.from_bytes(buffer[:4], "big")):
        out.append(bytes(buffer[: 4 + size]))
        del buffer[: 4 + size]
    return out
