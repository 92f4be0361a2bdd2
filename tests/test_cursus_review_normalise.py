"""Replay and serve compare frames by ``normalise``: it must take any frame
the decoder returns (bytes that are not UTF-8, words that do not read back
as written) rather than raise out of ``sluice replay`` or ``sluice serve``."""

from __future__ import annotations

import pytest

from sluice.addresses import Address
from sluice.protocols.cursus import decode_frame, frame
from sluice.recording.reader import Recording
from sluice.replay.cursus import CursusStub, normalise

FRAMES = [
    (b"OK generation=1 member=m\xff-8260 assignments=[0]", False),
    (b'{"status":"ERROR","error":"\xff NOT_LEADER LEADER_IS h:1"}', False),
    (b"\x00\x05adminCREATE topic=t =x=3", True),
]


@pytest.mark.parametrize(("body", "from_client"), FRAMES)
def test_normalise_takes_any_decoded_frame(body: bytes, from_client: bool) -> None:
    f = decode_frame(frame(body), from_client=from_client)
    assert f.error is None
    text = normalise(f)
    assert text == normalise(decode_frame(frame(body), from_client=from_client))


def test_the_json_error_address_is_masked_whatever_its_bytes() -> None:
    here = decode_frame(frame(FRAMES[1][0]), from_client=False)
    there = decode_frame(frame(FRAMES[1][0].replace(b"h:1", b"k:2")), from_client=False)
    assert normalise(here) == normalise(there)


def test_serve_answers_a_request_whose_words_do_not_read_back() -> None:
    stub = CursusStub(Recording([], "full", 0, []), Address("127.0.0.1", 1))
    out = stub.reply_to(decode_frame(frame(FRAMES[2][0]), from_client=True))
    assert out and b"not_in_recording" in out[0]
