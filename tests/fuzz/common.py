"""What the fuzz harnesses share."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, TypeVar

from sluice.protocols.errors import RemoteProtocolError

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
# Every harness, by name: tests/fuzz/fuzz_<name>.py, seeds in corpus/<name>/.
HARNESSES = (
    "pulsar_codec",
    "pulsar_payload",
    "cursus_codec",
    "pulsar_proxy",
    "proxy_header",
    "recording",
)


class Violation(AssertionError):
    """A harness found the code breaking one of its promises."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise Violation(message)


def chunked(data: bytes, plan: int) -> list[bytes]:
    """``data`` cut into reads the way ``plan`` says: chunks of 1 to
    2**(plan % 13) bytes, their sizes drawn from a generator seeded with
    ``plan`` (the same plan always cuts the same way)."""
    rng = random.Random(plan)
    top = 1 << (plan % 13)
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        size = rng.randint(1, top)
        out.append(data[pos : pos + size])
        pos += size
    return out


class Framed(Protocol):
    @property
    def raw(self) -> bytes: ...


F = TypeVar("F", bound=Framed)
F_co = TypeVar("F_co", bound=Framed, covariant=True)


class Decoder(Protocol[F_co]):
    """What the Pulsar and the Cursus ``FrameDecoder`` have in common."""

    @property
    def buffered(self) -> int: ...

    def receive_data(self, data: bytes) -> None: ...

    def next_event(self) -> object: ...

    def frames(self) -> Iterator[F_co]: ...


def decode(
    decoder: Decoder[F], chunks: list[bytes], *, stepwise: bool, need_data: object, closed: object
) -> tuple[list[F], RemoteProtocolError | None]:
    """Every frame ``decoder`` makes of the chunks (then the end of the
    stream), through ``next_event()`` or ``frames()``, and the fatal error
    that ended it (None: it closed cleanly). Checks what every decoder
    promises: only a fatal ``RemoteProtocolError`` is raised, then raised
    again; ``buffered`` counts what was read and not returned; a clean end
    stays closed."""
    frames: list[F] = []
    received = 0
    try:
        for chunk in [*chunks, b""]:
            decoder.receive_data(chunk)
            received += len(chunk)
            if stepwise:
                while (event := decoder.next_event()) is not need_data and event is not closed:
                    frames.append(event)  # type: ignore[arg-type]
                check(event is need_data or not chunk, f"{event!r} before the end")
            else:
                for frame in decoder.frames():
                    frames.append(frame)
            used = sum(len(f.raw) for f in frames)
            check(decoder.buffered == received - used, "buffered does not add up")
        check(decoder.next_event() is closed, "a closed stream did not stay closed")
    except RemoteProtocolError as exc:
        check(exc.fatal, f"non-fatal error raised: {exc!r}")
        try:
            decoder.next_event()
        except RemoteProtocolError as again:
            check(again is exc, "a broken decoder raised another error")
        else:
            raise Violation("a broken decoder went on") from exc
        return frames, exc
    return frames, None
