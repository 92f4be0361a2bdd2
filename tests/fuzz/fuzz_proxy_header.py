"""Fuzz harness: the PROXY protocol reader (``sluice.protocols.haproxy``),
fed the way ``sluice.proxy.inbound`` feeds it, before any other byte of a
connection is read.

Input: one byte that picks how reads are cut (each read takes 1 to
``wanted`` bytes, sizes drawn from a generator seeded with it), then the
bytes a connection starts with. Promises checked:

- the reader raises nothing but ``HeaderError``, with one of ``REASONS``
  and a short message;
- it never asks for a byte past the header: a header it returns took
  exactly its ``size`` bytes, and every byte fed was asked for;
- the outcome is the same however the reads are cut (one byte at a time,
  or as much as ``wanted`` allows);
- a header naming addresses, written again by ``v2_header``, reads back
  to the same client.
"""

from __future__ import annotations

import random

from sluice.protocols.haproxy import REASONS, HeaderError, HeaderReader, ProxyHeader, v2_header
from tests.fuzz.common import check

Outcome = tuple[ProxyHeader | None, str | None, int]


def read(stream: bytes, sizes: random.Random | None) -> Outcome:
    """The header (or the refusal's reason) and how many bytes were read."""
    reader = HeaderReader()
    at = 0
    try:
        while reader.wanted:
            wanted = reader.wanted
            size = wanted if sizes is None else sizes.randint(1, wanted)
            chunk = stream[at : at + size]
            check(len(chunk) <= wanted, "read past what was wanted")
            at += len(chunk)
            if not chunk:
                reader.end()
            reader.feed(chunk)
    except HeaderError as error:
        check(error.reason in REASONS, f"unknown reason {error.reason!r}")
        check(len(error.message) < 200, "a refusal message too long for one log line")
        return None, error.reason, at
    header = reader.header
    check(header is not None and header.size == at, "the header's size is not what was read")
    return header, None, at


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    plan, stream = data[0], data[1:]
    whole = read(stream, None)
    cut = read(stream, random.Random(plan))
    bytewise = read(stream, random.Random(0)) if plan & 1 else cut
    check(cut[:2] == whole[:2], f"the cut changed the outcome: {cut[:2]} != {whole[:2]}")
    check(bytewise[:2] == whole[:2], "reading in other cuts changed the outcome")
    header = whole[0]
    if header is not None and header.source is not None and header.destination is not None:
        again, reason, _ = read(v2_header(header.source, header.destination), None)
        check(reason is None and again is not None, f"our own header refused: {reason}")
        assert again is not None
        check(again.source == header.source, f"{again.source} != {header.source}")
