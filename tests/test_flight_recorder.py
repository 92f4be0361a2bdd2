"""The flight recorder: bounded recording directories, the in-memory ring,
snapshots on demand and on triggers, with the real client and broker."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pulsar
import pytest
import trio
import trio.testing

from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.protocols.core import Conn
from sluice.protocols.pulsar import Type, command, decode_frame, encode
from sluice.recording.format import read_records, recording_files
from sluice.recording.reader import load
from sluice.recording.retention import Retention, enforce, hold
from sluice.recording.writer import Recorder, RecorderConfig, SnapshotBusy
from tests.helpers.support import (
    QUIET,
    SLUICE,
    ProxyProcess,
    client,
    holds_a_client,
    one_client_per_worker,
    start_proxy,
    wait_ready,
    worker_pids,
)
from tests.test_dashboards import scrape, value
from tests.test_retention_bound import SizeSampler

MiB = 1024 * 1024


def test_the_directory_stays_under_its_cap_through_ten_times_the_traffic(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    cap = 2 * MiB
    record, admin = tmp_path / "rec", free_port()
    proxy = start_proxy(broker.url, tmp_path, "--record", str(record), "--record-payloads",
                        "full", "--record-retain-bytes", str(cap), "--record-flush-interval",
                        "0.1", "--admin", f"127.0.0.1:{admin}")  # fmt: skip
    payload = b"x" * 10_000
    try:
        # Back to back (a listing and a stat per file each): an excess the
        # writer leaves for even a moment (it makes room before it writes) is
        # seen; one sample every 10 ms could miss it.
        with SizeSampler(record, every=0) as watch, client(proxy.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            for _ in range(10 * cap // len(payload)):  # SEND frames alone: 10x the cap
                producer.send(payload)
            # The writer may still hold some of it (a loaded machine): until written.
            deadline = time.monotonic() + 30
            samples = scrape(proxy, admin)
            while value(samples, "sluice_recorder_removed_bytes_total") < 8 * MiB:
                assert time.monotonic() < deadline, "the recording was not written"
                time.sleep(0.1)
                samples = scrape(proxy, admin)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    print(f"largest {watch.largest} of {cap} bytes in {len(watch.samples)} samples")
    assert 0 < watch.largest <= cap
    assert watch.size() <= cap
    assert value(samples, "sluice_recorder_removed_files_total") >= 5
    assert value(samples, "sluice_recorder_removed_bytes_total") >= 8 * MiB
    # What is left reads as a recording that starts later, never an error.
    shown = subprocess.run([*SLUICE, "inspect", str(record), "--summary"], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "SEND" in shown.stdout


def test_retention_by_age_and_files_being_written_are_kept(tmp_path: Path) -> None:
    (tmp_path / "snapshot-1").mkdir()
    old = [tmp_path / "a.sluice", tmp_path / "snapshot-1" / "b.sluice"]
    for path in old:
        path.write_bytes(b"x" * 100)
    now = time.time()
    for path in old:
        os.utime(path, (now - 600, now - 600))
    held = tmp_path / "c.sluice"
    held.write_bytes(b"y" * 100)
    os.utime(held, (now - 600, now - 600))
    fresh = tmp_path / "d.sluice"
    fresh.write_bytes(b"z" * 100)
    with open(held, "ab") as writer:
        hold(writer.fileno())
        removed = enforce(tmp_path, Retention(max_age=60), headroom=0, now=now)
    assert (removed.files, removed.bytes) == (2, 200)
    assert not (tmp_path / "snapshot-1").exists()  # emptied, so removed
    assert held.exists() and fresh.exists()
    # By size: the oldest go first, and never the file given as "keep".
    removed = enforce(tmp_path, Retention(max_bytes=150), headroom=0, now=now, keep=held)
    assert not fresh.exists() and held.exists() and removed.files == 1


# --- the ring and snapshots ---------------------------------------------------------------

TOKEN = "flight-recorder-token"


def ring_proxy(
    broker_url: str, tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[ProxyProcess, int, Path]:
    record, admin = tmp_path / "rec", free_port()
    token = tmp_path / "admin-token"
    token.write_text(TOKEN)
    proxy = start_proxy(broker_url, tmp_path, "--record", str(record), "--record-payloads",
                        "full", "--admin", f"127.0.0.1:{admin}", "--admin-token-file",
                        str(token), *extra, env=env)  # fmt: skip
    return proxy, admin, record


def snapshot_cli(admin: int, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SLUICE, "record", "snapshot", "--admin", f"127.0.0.1:{admin}",
         "--admin-token-file", str(tmp_path / "admin-token"), *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def sent_payloads(capture: Path) -> list[bytes]:
    recording = load(capture)
    return [
        bytes(f.frame.payload)
        for c in recording.connections
        for f in c.frames
        if f.from_client and f.frame.name == "SEND"
    ]


def test_a_snapshot_on_demand_holds_the_last_seconds_and_nothing_is_written_before(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    proxy, admin, record = ring_proxy(broker.url, tmp_path, "--record-ring", "8M")
    try:
        with client(proxy.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            for i in range(20):
                producer.send(f"early-{i}".encode())
            early_done = time.monotonic()
            time.sleep(2.5)  # a gap in the traffic, where the recent snapshot starts
            late_from = time.monotonic()
            for i in range(20):
                producer.send(f"late-{i}".encode())
            assert not recording_files(record)  # memory only, so far
            # Through the endpoint, not the command: a loaded machine can take
            # longer than the gap to start a process, and the window would move.
            last = time.monotonic() - (early_done + late_from) / 2
            status, answer = http_post(admin, json.dumps({"last": last}).encode())
            everything = snapshot_cli(admin, tmp_path, "--reason", "bug 1234")
        samples = scrape(proxy, admin)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    assert status == 201, answer
    capture = Path(json.loads(answer)["path"])
    assert capture.parent == record
    assert sent_payloads(capture) == [f"late-{i}".encode() for i in range(20)]
    # The connection opened before those seconds is restated, so the
    # capture reads on its own (inspect names its topic).
    shown = subprocess.run([*SLUICE, "inspect", str(capture)], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert shown.returncode == 0 and topic.rsplit("/", 1)[1] in shown.stdout, shown.stderr
    assert everything.returncode == 0, everything.stderr
    whole = Path(everything.stdout.strip())
    assert whole.parent == record and "bug-1234" in whole.name
    assert sent_payloads(whole) == [f"{w}-{i}".encode() for w in ("early", "late")
                                    for i in range(20)]  # fmt: skip
    assert value(samples, "sluice_snapshots_total", reason="on_demand") == 2


def test_the_ring_stays_within_its_bound(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    bound = 1 * MiB
    proxy, admin, record = ring_proxy(broker.url, tmp_path, "--record-ring", str(bound))
    largest = 0.0
    try:
        with client(proxy.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            for i in range(1000):  # 10 MB of SEND frames alone
                producer.send(b"r" * 10_000)
                if i % 50 == 0:
                    largest = max(
                        largest, value(scrape(proxy, admin), "sluice_recorder_ring_bytes")
                    )
        held = value(scrape(proxy, admin), "sluice_recorder_ring_bytes")
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    print(f"ring: largest {largest:.0f} bytes, at the end {held:.0f}, bound {bound}")
    assert bound / 2 < held and largest <= bound + 256 * 1024  # the bound plus one part
    assert not recording_files(record)


def test_snapshot_requests_that_cannot_be_served(broker: EmbeddedBroker, tmp_path: Path) -> None:
    proxy, admin, _ = ring_proxy(broker.url, tmp_path)  # recording to files, no ring
    try:
        no_ring = snapshot_cli(admin, tmp_path)
        assert no_ring.returncode == 1 and "--record-ring" in no_ring.stderr
        no_token = subprocess.run([*SLUICE, "record", "snapshot", "--admin", f"127.0.0.1:{admin}"],
                                  capture_output=True, text=True, timeout=60)  # fmt: skip
        assert no_token.returncode == 1 and "401" in no_token.stderr
        for bad_body in (b'{"last": -1}', b'{"last": NaN}', b'{"last": 1e300}',
                         b'{"name": "../x"}', b'{"reason": 5}', b"[1]", b"not json"):  # fmt: skip
            assert http_post(admin, bad_body)[0] == 400, bad_body
        assert http_post(admin, b"{}")[0] == 409  # still alive, and says why not
    finally:
        proxy.kill()
    for options, why in (
        (["--record-ring", "lots"], "--record-ring"),
        (["--record", str(tmp_path / "r"), "--record-ring", "64M", "--record-retain-bytes", "80M"],
         "three quarters"),
        (["--record", str(tmp_path / "r"), "--record-ring", "8M", "--snapshot-on",
          '{"on": "error", "before": NaN}'], "before is a number"),
        (["--record", str(tmp_path / "r"), "--record-ring", "8M", "--snapshot-on",
          '{"on": "error", "interval": 0}'], "interval is a number from 1"),
    ):  # fmt: skip
        bad = subprocess.run([*SLUICE, "proxy", "--broker", broker.url, *options],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert bad.returncode == 2 and why in bad.stderr, (options, bad.stderr)
        assert "Traceback" not in bad.stderr


def http_post(admin: int, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{admin}/recording/snapshot", data=body,
                                     method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def test_a_second_snapshot_while_one_is_written_is_refused(tmp_path: Path) -> None:
    recorder = Recorder(RecorderConfig(tmp_path, ring_bytes=MiB))
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    # The first snapshot's write is held until the second has been refused.
    release = trio.Event()
    write_in_thread = recorder._io

    async def held_io(fn: Any, *args: Any) -> Any:
        await release.wait()
        return await write_in_thread(fn, *args)

    recorder._io = held_io  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        first: list[Any] = []

        async def take() -> None:
            first.append(await recorder.snapshot(reason="first"))

        nursery.start_soon(take)
        await trio.testing.wait_all_tasks_blocked()  # the first one is writing now
        with pytest.raises(SnapshotBusy):
            await recorder.snapshot(reason="second")
        release.set()
        while not first:
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert len(list(tmp_path.iterdir())) == 1  # one capture directory


# --- triggers -----------------------------------------------------------------------------


def test_a_send_error_saves_the_seconds_around_it_once_per_interval(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    """A fault rule answers the 121st and 122nd SEND with SEND_ERROR, 6 s in;
    the rule on errors fires twice within its interval and saves one
    snapshot: 2 s before the first error (not the ring's 6 s) and 2 s after
    it, holding that SEND_ERROR."""
    before, after = 2.0, 2.0
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"id": "break", "match": {"command": "SEND"},
                                   "action": "error", "error": "PersistenceError",
                                   "after": 120, "times": 2}]))  # fmt: skip
    rules = json.dumps([{"id": "send-errors", "on": "error", "match": {"command": "SEND"},
                         "codes": ["PersistenceError"], "before": before, "after": after,
                         "interval": 60}])  # fmt: skip
    # Parts of the ring every 0.1 s: a snapshot starts within 0.1 s of its window.
    proxy, admin, record = ring_proxy(broker.url, tmp_path, "--record-ring", "16M", "--faults",
                                      str(faults), "--snapshot-on", rules,
                                      "--record-flush-interval", "0.1")  # fmt: skip
    failed: list[tuple[int, str]] = []
    try:
        with client(proxy.url) as c:
            producer = c.create_producer(topic, batching_enabled=False, send_timeout_millis=30_000)
            started = time.monotonic()
            for i in range(220):  # 11 s at 20 a second; the errors come after 6 s
                try:
                    producer.send(f"m-{i:03d}".encode())
                except pulsar.PulsarException as exc:
                    failed.append((i, repr(exc)))
                time.sleep(max(0.0, started + (i + 1) / 20 - time.monotonic()))
        # The official client gives up on no send: after each SEND_ERROR it
        # reconnects and sends again what had no receipt.
        assert failed == [], failed
        deadline = time.monotonic() + 20
        while not (snapshots := sorted(record.glob("snapshot-*"))):
            assert time.monotonic() < deadline, "no snapshot"
            time.sleep(0.1)
        samples = scrape(proxy, admin)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    assert len(snapshots) == 1 and "send-errors" in snapshots[0].name
    assert value(samples, "sluice_snapshots_total", reason="send-errors") == 1
    assert "snapshot rule send-errors fired again" in proxy.log()  # the second: not saved
    records = [r for path in recording_files(snapshots[0]) for r in read_records(path)]
    marker = next(r for r in records if r["k"] == "snapshot")
    assert marker["rule"] == "send-errors" and marker["error"] == "PersistenceError"
    fired = [r for r in records if r["k"] == "trigger"]
    assert len(fired) == 1 and fired[0]["cmd"] == "SEND"
    shown = subprocess.run([*SLUICE, "inspect", str(snapshots[0])], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert "SNAPSHOT RULE send-errors (error)" in shown.stdout, shown.stdout[-2000:]
    assert "SNAPSHOT of" in shown.stdout
    errors = [r for r in records if r["k"] == "frame" and r["s"].get("cmd") == "SEND_ERROR"]
    assert errors, "the SEND_ERROR that fired the rule is in the snapshot"
    # Where the snapshot begins and ends, on the recording's own clock: its
    # first frame `before` seconds ahead of the trigger (the ring holds 6 s
    # ahead of it), and it is taken `after` seconds after the trigger.
    frames = [r["t"] for r in records if r["k"] == "frame"]
    ahead = (fired[0]["t"] - min(frames)) / 1e9
    assert before - 0.5 <= ahead <= before + 0.5, f"the snapshot starts {ahead:.2f} s ahead"
    assert (marker["t"] - fired[0]["t"]) / 1e9 >= after
    sent = collections.Counter(sent_payloads(snapshots[0]))
    # m-120 three times: answered with an error twice, then sent through.
    assert {p: n for p, n in sent.items() if n > 1} == {b"m-120": 3}
    sends = sorted(sent)
    first, last = int(sends[0][2:]), int(sends[-1][2:])
    # About 40 sends before the error (2 s at 20/s; fewer where the client
    # fell behind its pace on a busy machine), never from the first, and some
    # after it.
    assert 20 <= first <= 120 - 10, sends[:3]
    assert 120 + 2 <= last <= 120 + 80, sends[-3:]


def test_a_snapshot_with_two_workers_holds_both_workers_connections(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    proxy, admin, _ = ring_proxy(broker.url, tmp_path, "--record-ring", "8M", "--workers", "2")
    clients: list[pulsar.Client] = []
    try:
        wait_ready(admin)
        pids = worker_pids(proxy, 2)

        def connect() -> None:
            c = pulsar.Client(proxy.url, operation_timeout_seconds=15, logger=QUIET)
            c.create_producer(topic, batching_enabled=False).send(f"w-{len(clients)}".encode())
            clients.append(c)

        one_client_per_worker(pids, connect)
        assert all(holds_a_client(pid, proxy.port) for pid in pids.values())
        taken = snapshot_cli(admin, tmp_path, "--reason", "both", "--json")
        assert taken.returncode == 0, taken.stderr
    finally:
        for c in clients:
            c.close()
        proxy.kill()
    answer = json.loads(taken.stdout)
    assert answer["workers"] == 2 and not answer["failed"]
    capture = Path(answer["path"])
    recording = load(capture)
    assert len({conn.key[0] for conn in recording.connections}) == 2  # both workers' captures
    assert sorted(sent_payloads(capture)) == sorted(f"w-{n}".encode() for n in range(len(clients)))


@pytest.mark.e2e  # runs sluice inspect
async def test_a_snapshot_starts_where_its_oldest_record_does(tmp_path: Path) -> None:
    """Offsets in a snapshot (sluice inspect --since) count from its oldest
    record, not from when the snapshot was taken."""
    conn = Conn(1, "127.0.0.1:5555", "plain", "pulsar")
    ping = decode_frame(encode(command(Type.Value("PING"))))
    recorder = Recorder(RecorderConfig(tmp_path, ring_bytes=MiB, flush_interval=0.02))
    recorder.open_connection(1, client="127.0.0.1:5555", kind="proxied", listener="plain",
                             broker="127.0.0.1:6650")  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        for _ in range(8):
            recorder.frames(conn, True, [ping])
            await trio.sleep(0.1)
        snap = await recorder.snapshot(reason="test")
        nursery.cancel_scope.cancel()
    records = list(read_records(snap.file))
    walls = [r["w"] for r in records if r["k"] == "frame"]
    assert len(walls) == 8
    assert records[0]["started"] <= walls[0] < records[0]["started"] + 50_000_000
    later = subprocess.run([*SLUICE, "inspect", str(snap.file), "--since", "0.35", "--summary"],
                           capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    expected = sum(w - records[0]["started"] >= 350_000_000 for w in walls)
    assert expected >= 1
    assert f"{expected} frames on 1 connections" in later.stdout, later.stdout


def test_a_snapshot_starts_at_its_earliest_record_not_its_first() -> None:
    """An HTTP exchange is written when it ends, with the time it began: it
    can follow records later than it in the part."""
    from sluice.recording.format import pack
    from sluice.recording.writer import _first_wall

    part = b"".join(pack(r) for r in ({"k": "frame", "w": 20}, {"k": "http", "w": 10}, {"k": "x"}))
    assert _first_wall(part) == 10
    assert _first_wall(pack({"k": "gap"})) is None


async def test_a_trigger_storm_through_the_recorder_logs_a_line_not_one_per_firing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from sluice.protocols.core import Answered
    from sluice.recording.triggers import Trigger

    caplog.set_level("INFO", logger="sluice")
    conn = Conn(1, "127.0.0.1:5555", "plain", "pulsar")
    rule = Trigger(id="errors", on="error", before=1.0, after=0.0, interval=60.0)
    recorder = Recorder(RecorderConfig(tmp_path, ring_bytes=MiB, triggers=(rule,)))
    recorder.open_connection(1, client="127.0.0.1:5555", kind="proxied", listener="plain")
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        for _ in range(500):  # one saved, 499 counted
            recorder.event(conn, Answered("SEND", 0.001, error="PersistenceError"))
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records if "snapshot rule errors" in r.getMessage()]
    assert 2 <= len(said) <= 3, said  # fired (saving); the storm summed up, at close at the latest
    assert said[-1].startswith("snapshot rule errors fired again 499 times"), said
