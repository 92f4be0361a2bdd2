"""What the fuzz harnesses share."""

from __future__ import annotations

import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
# Every harness, by name: tests/fuzz/fuzz_<name>.py, seeds in corpus/<name>/.
HARNESSES = ("pulsar_codec", "pulsar_payload", "cursus_codec", "pulsar_proxy")


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
