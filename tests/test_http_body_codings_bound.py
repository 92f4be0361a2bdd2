"""A recorded HTTP body's content codings are undone (to look for
credentials) at most ``MAX_CODINGS`` deep. A client's head of 16 KiB can
name some 3,000 ``gzip`` codings, and a body of gzip layers over stored
blocks keeps its size at every layer: undoing each cost about ``limit``
bytes of work on the event loop (3.8 s for 3,000 layers of 4 MiB, every
other connection of the process stalled meanwhile)."""

from __future__ import annotations

import time
import zlib

from sluice.protocols.http.recorded import MAX_CODINGS, decoded
from sluice.proxy.http_recording import Body
from sluice.recording import format as fmt

LIMIT = 256 * 1024


def _layered(plain: bytes, layers: int) -> bytes:
    """``plain`` gzipped ``layers`` times, stored (level 0): every layer
    about as large as the last."""
    body = plain
    for _ in range(layers):
        packer = zlib.compressobj(0, zlib.DEFLATED, 31)
        body = packer.compress(body) + packer.flush()
    return body


def test_a_few_codings_are_undone() -> None:
    plain = b'{"n": 1}'
    assert decoded(_layered(plain, MAX_CODINGS), ["gzip"] * MAX_CODINGS, LIMIT) == plain


def test_many_codings_are_not_undone_and_cost_little() -> None:
    layers = 400
    body = _layered(b"x" * (LIMIT - 64 * 1024), layers)
    assert len(body) <= LIMIT
    started = time.perf_counter()
    assert decoded(body, ["gzip"] * layers, LIMIT) is None
    assert time.perf_counter() - started < 0.05


def test_such_a_body_is_recorded_by_its_digest() -> None:
    layers = MAX_CODINGS + 1
    recorded = Body(fmt.PayloadPolicy.FULL, limit=LIMIT)
    recorded.add(_layered(b'{"n": 1}', layers))
    record, _ = recorded.record([(b"content-encoding", b", ".join([b"gzip"] * layers))])
    assert "raw" not in record and record["p"][0] == recorded.size
