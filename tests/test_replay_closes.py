"""Pulsar replay: the closes recorded together wait side by side."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.protocols.pulsar import Type, command, decode_frame, encode
from sluice.recording import format as fmt
from sluice.recording.format import read_records, recording_files
from sluice.recording.reader import load
from tests.helpers.support import SLUICE, client, recorded_session, start_proxy
from tests.test_dashboards import scrape, value

T = Type.Value


def two_clients(url: str) -> None:
    """One client produces and goes away (its lookup and its broker
    connection closed together), then another produces."""
    for name in ("h2-closes-a", "h2-closes-b"):
        with client(url) as c:
            producer = c.create_producer(f"persistent://public/default/{name}",
                                         batching_enabled=False)  # fmt: skip
            producer.send(name.encode())


def test_closes_due_together_wait_side_by_side(broker: EmbeddedBroker, tmp_path: Path) -> None:
    """The first client's lookup connection is made to expect an answer no
    broker sends: its close waits for it (up to a --timeout far longer than
    the test), and its broker connection, closed with it when recorded, is
    closed meanwhile (it waited behind it, a timeout per close)."""
    (tmp_path / "recorded").mkdir()
    recording = recorded_session(tmp_path / "recorded", two_clients)
    lookup, own = sorted(load(recording).connections, key=lambda c: c.frames[0].index)[:2]
    assert lookup.kind == "lookup"
    stuck, first = lookup.key[1], {lookup.key[1], own.key[1]}
    # The first client's two closes, recorded together: the proxy may see the
    # second client's first connection between them (it starts as soon as
    # the first returns), and a close recorded after another client's frame
    # rightly waits behind it. Put both where the first of them was.
    closes = [r for path in recording_files(recording) for r in read_records(path)
              if r["k"] == "close" and r["c"] in first]  # fmt: skip
    assert len(closes) == 2
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    answer: dict[str, Any] | None = None
    planted = False
    for path in recording_files(recording):
        records: list[dict[str, Any]] = []
        for r in read_records(path):
            if r["k"] == "frame" and r["c"] == stuck and r["s"]["cmd"] == "LOOKUP_RESPONSE":
                answer = r
            if r["k"] == "close" and r["c"] in first:
                if not planted:
                    assert answer is not None
                    planted = True  # before the first client's closes, one index for both
                    body = decode_frame(answer["raw"]).body
                    body.request_id = 999  # asked for by nothing: it will not come
                    raw = encode(command(T("LOOKUP_RESPONSE"), body))
                    fake = {k: v for k, v in answer.items() if k != "s"}
                    records += [{**fake, "raw": raw, "n": len(raw)}, *closes]
                continue
            records.append(r)
        (tampered / path.name).write_bytes(fmt.dumps(records))
    assert planted
    admin = free_port()
    proxy = start_proxy(broker.url, tmp_path, "--admin", f"127.0.0.1:{admin}")
    replay: subprocess.Popen[bytes] | None = None
    try:
        before = value(scrape(proxy, admin), "sluice_connections_opened_total", listener="plain")
        replay = subprocess.Popen(
            [*SLUICE, "replay", str(tampered), "--broker", proxy.url, "--timeout", "600"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

        def state() -> tuple[float, float]:
            samples = scrape(proxy, admin)
            return (value(samples, "sluice_connections_opened_total", listener="plain") - before,
                    value(samples, "sluice_connections_active", listener="plain"))  # fmt: skip

        deadline = time.monotonic() + 30
        while state() != (2, 1) and time.monotonic() < deadline:
            assert replay.poll() is None, "replay ended"
            time.sleep(0.05)
        # Both of the first client's connections opened; the one with all
        # its answers closed while the other still waits.
        assert state() == (2, 1), state()
    finally:
        if replay is not None:
            replay.kill()
            replay.wait(10)
        proxy.kill()
