"""`sluice replay --speed`: the recorded time between client frames is kept
(divided by the multiplier), the wait for their answers counted in it, as
the broker's answering was when recorded. Replayed in-process against the
scripted Cursus broker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio

from sluice.addresses import parse_address
from sluice.protocols.cursus.commands import Create
from sluice.protocols.cursus.encoder import encode_reply, encode_request
from sluice.protocols.cursus.replies import OkReply
from sluice.recording import format as fmt
from sluice.recording.reader import load
from sluice.replay.cursus import replay
from tests.helpers.cursus_broker import open_cluster

GAP = 1.0  # seconds between the two CREATEs when recorded


def two_clients(directory: Path) -> Path:
    """c1 creates topic a and is answered; an answer the live broker will not
    send is recorded after it (its wait runs out at --timeout); c1 closes;
    GAP later, c2 creates topic b."""
    now = time.time_ns()
    ns = int(GAP * 1e9)
    create_a = encode_request(Create(topic="a"), envelope_topic="admin")
    create_b = encode_request(Create(topic="b"), envelope_topic="admin")
    ok = encode_reply(OkReply.of(topic="a"))
    header = {
        "k": "header",
        "format": "sluice-recording",
        "version": 2,
        "sluice": "0.1.0",
        "protocol": "cursus",
        "capture": "0123456789ab",
        "segment": 1,
        "started": now,
        "host": "h",
        "listen": ["127.0.0.1:9000"],
        "broker": "cursus://127.0.0.1:9001",
        "payloads": "full",
        "redaction": {"credentials": "always", "marker": "<redacted>"},
    }

    def conn(c: int, t: int) -> dict[str, Any]:
        return {
            "k": "conn",
            "c": c,
            "t": t,
            "w": now + t,
            "client": f"127.0.0.1:4000{c}",
            "broker": "cursus://127.0.0.1:9001",
            "kind": "relay",
            "listener": "plain",
        }

    def frame(c: int, d: int, t: int, raw: bytes, cmd: str) -> dict[str, Any]:
        return {
            "k": "frame",
            "c": c,
            "d": d,
            "t": t,
            "w": now + t,
            "n": len(raw),
            "raw": raw,
            "s": {"cmd": cmd},
        }

    records = [
        header, conn(1, 0),
        frame(1, 0, 1_000, create_a, "CREATE"),
        frame(1, 1, 2_000, ok, "OK"),
        frame(1, 1, 3_000, ok, "OK"),  # never sent live
        {"k": "close", "c": 1, "t": 4_000, "w": now + 4_000},
        conn(2, ns),
        frame(2, 0, 1_000 + ns, create_b, "CREATE"),
    ]  # fmt: skip
    path = directory / "sluice-20261207T000000-0123456789ab-0001.sluice"
    path.write_bytes(fmt.dumps(records))
    return path


async def test_realtime_keeps_the_recorded_gap_counting_the_wait_in_it(tmp_path: Path) -> None:
    """The wait for c1's answers (it runs out after --timeout, shorter than
    the gap) is part of the recorded gap: c2's CREATE goes out GAP after
    c1's, not --timeout + GAP (each recorded gap was slept after the waits
    for answers, so replay ran slower than realtime)."""
    recording = load(two_clients(tmp_path))
    timeout = 0.7
    async with open_cluster(1) as fresh:
        created: dict[str, float] = {}

        async def watch() -> None:
            while len(created) < 2:
                for topic in fresh.topics:
                    created.setdefault(topic, trio.current_time())
                await trio.sleep(0.005)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            with trio.fail_after(10):
                outcome, _ = await replay(recording, parse_address(fresh.address),
                                          timeout=timeout, say=lambda text: None,
                                          speed=1.0)  # fmt: skip
            nursery.cancel_scope.cancel()
    assert outcome.sent == 2 and set(created) == {"a", "b"}, (outcome, created)
    between = created["b"] - created["a"]
    assert GAP - 0.05 <= between < GAP + timeout / 2, between


async def test_a_multiplier_divides_the_recorded_gap(tmp_path: Path) -> None:
    recording = load(two_clients(tmp_path))
    async with open_cluster(1) as fresh:
        created: dict[str, float] = {}

        async def watch() -> None:
            while len(created) < 2:
                for topic in fresh.topics:
                    created.setdefault(topic, trio.current_time())
                await trio.sleep(0.005)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            with trio.fail_after(10):
                await replay(recording, parse_address(fresh.address), timeout=0.1,
                             say=lambda text: None, speed=2.0)  # fmt: skip
            nursery.cancel_scope.cancel()
    between = created["b"] - created["a"]
    assert GAP / 2 - 0.05 <= between < GAP / 2 + 0.3, between
