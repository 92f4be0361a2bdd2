"""``POST /recording/snapshot``'s body: what it may ask for."""

from __future__ import annotations

import json

import pytest

from sluice.proxy.admin import Refused, SnapshotRequest


@pytest.mark.parametrize(
    "reason", ["ok\nWARNING sluice.admin: forged line", "a\rb", "\x1b[2J", "\x00"]
)
def test_a_reason_with_a_control_character_is_refused(reason: str) -> None:
    # The reason is logged (at WARNING) as it is: a newline in it wrote a
    # line of the caller's choosing into the proxy's log.
    with pytest.raises(Refused) as info:
        SnapshotRequest.parse(json.dumps({"reason": reason}).encode())
    assert info.value.status == 400 and "control character" in info.value.message


def test_a_reason_in_words_is_taken() -> None:
    wanted = SnapshotRequest.parse(
        json.dumps({"reason": "déjà vu: lag, 30 s", "last": 30}).encode()
    )
    assert (wanted.reason, wanted.last) == ("déjà vu: lag, 30 s", 30.0)
