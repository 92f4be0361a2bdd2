"""Cursus decoding: integers in text the decoder must refuse, not raise on."""

from __future__ import annotations

import struct

import pytest

from sluice.protocols.cursus import Frame, OkReply, Problem, decode_frame

HUGE = "9" * 5000  # past Python's int-from-text limit (4300 digits)


def one(body: bytes, *, from_client: bool, **kw: object) -> Frame:
    return decode_frame(struct.pack(">I", len(body)) + body, from_client=from_client, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        f"CONSUME topic=t partition=0 offset={HUGE}",
        f"COMMIT_OFFSET topic=t partition={HUGE} group=g offset=1",
        f"BATCH_COMMIT topic=t group=g member=m generation=1 P0:{HUGE}",
        f"BATCH_COMMIT topic=t group=g member=m generation=1 P{HUGE}:1",
    ],
)
def test_a_command_with_a_huge_integer_is_invalid_not_a_crash(text: str) -> None:
    for body in (text.encode(), b"\x00\x00" + text.encode()):
        f = one(body, from_client=True)
        assert f.error is not None and f.error.problem is Problem.PARSE
        assert f.error.code == "invalid_command"


def test_integers_past_64_bits_are_refused_as_the_broker_would() -> None:
    f = one(f"CONSUME topic=t partition=0 offset={2**64}".encode(), from_client=True)
    assert f.error is not None and f.error.problem is Problem.PARSE
    ok = one(f"CONSUME topic=t partition=0 offset={2**64 - 1}".encode(), from_client=True)
    assert ok.error is None and ok.message.offset == 2**64 - 1  # type: ignore[union-attr]


def test_a_stream_control_with_a_huge_offset_is_invalid_not_a_crash() -> None:
    f = one(f"STREAM_CONTROL type=CLOSE reason=stopped offset={HUGE}".encode(), from_client=False)
    assert f.error is not None and f.error.problem is Problem.PARSE


def test_assignments_with_a_huge_partition_do_not_raise() -> None:
    f = one(f"OK generation=1 member=m assignments=[0 {HUGE} 2]".encode(), from_client=False)
    assert isinstance(f.message, OkReply)
    assert f.message.assignments == [0, 2]
