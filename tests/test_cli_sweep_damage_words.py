"""A capture damaged where its bytes no longer decode: the reader says
what is wrong in the recording's terms, not the decoder's exception text
("unhashable type: 'dict'", a codec's byte positions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sluice.recording.format import PayloadPolicy, dumps, header

SLUICE = str(Path(sys.executable).with_name("sluice"))

CASES = [
    # a map whose one key is itself a map
    (b"\x81\x81\xa1a\x01\x01", "a map keyed by a map"),
    # a map whose key is a string of one byte that is not UTF-8
    (b"\x81\xa1\xff\x01", "text that is not UTF-8"),
]


@pytest.mark.e2e
@pytest.mark.parametrize(("damage", "said"), CASES)
def test_undecodable_bytes_are_said_in_the_recordings_terms(
    tmp_path: Path, damage: bytes, said: str
) -> None:
    path = tmp_path / "x.sluice"
    head = header(capture="c", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
                  sluice_version="test", protocol="pulsar")  # fmt: skip
    path.write_bytes(dumps([head]) + damage)
    done = subprocess.run([SLUICE, "inspect", str(path)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"sluice inspect: {path}: damaged after 1 records ({said})\n"
