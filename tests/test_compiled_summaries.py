"""The compiled summary reader (rust/src/summary.rs, ``sluice._frames.summary``)
against the Python one (``decode_frame`` and ``summarize``), the reference:
the same records, read in the same order, must come out the same, record by
record (keys in the same order, the same packed bytes), with the same
correlator state after them and the same errors. The compiled reader may
only take a frame whose summary it gives exactly; real recordings, every cut
and changed byte of real frames, and hypothesis-made frames check that.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings

from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.pulsar import Type, command, decode_frame, encode, encode_payload, pb
from sluice.protocols.pulsar.correlation import CLIENT_TYPES, SERVER_TYPES, Correlator
from sluice.protocols.pulsar.frame import HOT_TYPES, standalone
from sluice.recording import pulsar as fmt
from sluice.recording.format import (
    PayloadPolicy,
    Record,
    header,
    pack,
    read_records_from,
    recording_files,
)
from sluice.recording.pulsar import COMPILED_SUMMARY, FrameRecorder, FrameSummaries
from tests.helpers.strategies import commands, message_of, payload_frames
from tests.test_analyze import record as record_session
from tests.test_hotpath import golden_frames

T = Type.Value
HOT = sorted(HOT_TYPES)


def test_the_compiled_summary_reader_is_built() -> None:
    # ./dev builds it into the package; a missing build must fail, not fall back quietly.
    assert COMPILED_SUMMARY is not None, "sluice._frames.summary is not built: run ./dev setup"
    assert FrameSummaries()._compiled is COMPILED_SUMMARY
    assert FrameSummaries(compiled=False)._compiled is None


def test_observe_acts_on_the_hot_frames_the_compiled_path_says() -> None:
    """``_observe_hot`` stands for ``Correlator.observe`` on a client's SEND
    and ACK and a broker's SEND_RECEIPT, and the reader calls neither for
    any other hot frame: the sets that decide it must say so."""
    assert {t for t in HOT if t in CLIENT_TYPES} == {T("SEND"), T("ACK")}
    assert {t for t in HOT if t in SERVER_TYPES} == {T("SEND_RECEIPT")}


def _state(summaries: FrameSummaries) -> dict[int, Any]:
    def of(c: Correlator) -> Any:
        return (
            c.producers,
            c.consumers,
            c.sends.waiting(),
            {k: (p.type, p.started, p.topic, p.resource_id) for k, p in c.requests.items()},
            c.in_flight_sends,
        )

    return {conn: of(c) for conn, c in summaries._correlators.items()}


def _apply(summaries: FrameSummaries, record: Record) -> Any:
    """One record through a reader's FrameSummaries, as ``_records`` does;
    what it raised, if anything."""
    try:
        kind = record["k"]
        if kind == "frame":
            summaries.fill(record)
        elif kind == "conn":
            summaries.opened(record)
        elif kind == "close":
            summaries.closed(record)
    except Exception as exc:  # compared between the two paths
        return (type(exc), str(exc))
    return None


def assert_summarized_alike(records: Iterable[Record]) -> int:
    """Both readers over copies of ``records``, in order; how many frames
    the compiled reader took."""
    assert COMPILED_SUMMARY is not None
    fast, reference = FrameSummaries(compiled=True), FrameSummaries(compiled=False)
    taken = 0
    for record in records:
        a, b = copy.deepcopy(record), copy.deepcopy(record)
        assert _apply(fast, a) == _apply(reference, b)
        assert a == b, b.get("s")
        assert list(a.items()) == list(b.items())
        assert pack(a) == pack(b)
        if record.get("k") == "frame" and isinstance(record.get("raw"), bytes):
            taken += COMPILED_SUMMARY(record["raw"]) is not None
    assert _state(fast) == _state(reference)
    return taken


def frame_record(conn: int, direction: int, t: Any, raw: bytes, **extra: Any) -> Record:
    return {"k": "frame", "c": conn, "d": direction, "t": t, "w": t, "n": len(raw), "raw": raw,
            **extra}  # fmt: skip


def recorded(policy: PayloadPolicy) -> Iterator[Record]:
    """The golden streams (a real client and broker), and frames they lack,
    as the recorder writes them under ``policy``, read back raw."""
    recorder = FrameRecorder(policy)
    for conn, frames in golden_frames():
        for t, (direction, frame) in enumerate(frames):
            yield recorder.record(conn, direction, t, t, frame)


@pytest.mark.parametrize("policy", list(PayloadPolicy))
def test_real_frames_as_recorded_are_summarized_alike(policy: PayloadPolicy) -> None:
    records = list(recorded(policy))
    taken = assert_summarized_alike(records)
    hot = sum(decode_frame(standalone(r["raw"])).type in HOT_TYPES for r in records)
    # Every hot frame of the real client and broker is the compiled reader's,
    # payload or not (a few odd ones, and ACKs asking for receipts, are not).
    assert taken > 0.9 * hot > 100, (taken, hot)


@pytest.mark.parametrize("policy", list(PayloadPolicy))
def test_whole_recordings_read_back_alike(
    policy: PayloadPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the format's own reader (``read_records_from``), as every tool reads."""
    first = header(capture="c", segment=1, started_ns=0, payloads=policy, sluice_version="t")
    recorder = FrameRecorder(policy)
    data = [pack(first)]
    for conn, frames in golden_frames():
        data += recorder.packed(conn, 0, 1, 1, [f for d, f in frames if d == 0])
        data += recorder.packed(conn, 1, 2, 2, [f for d, f in frames if d == 1])
    fast = list(read_records_from(b"".join(data), "x.sluice"))
    monkeypatch.setattr(fmt, "COMPILED_SUMMARY", None)
    assert FrameSummaries()._compiled is None
    assert fast == list(read_records_from(b"".join(data), "x.sluice"))


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A real session recorded by the proxy (payloads hashed: left out)."""
    tmp = tmp_path_factory.mktemp("session")
    with EmbeddedBroker() as broker:
        return recording_files(record_session(broker, tmp, "s"))


def test_a_recording_made_by_the_proxy_is_summarized_alike(session: list[Path]) -> None:
    taken = hot = 0
    for path in session:
        with path.open("rb") as handle:
            records = list(msgpack.Unpacker(handle, raw=False, strict_map_key=False))
        taken += assert_summarized_alike(records[1:])
        hot += sum(
            decode_frame(standalone(r["raw"])).type in HOT_TYPES
            for r in records
            if r["k"] == "frame"
        )
    assert taken > 0.9 * hot > 30, (taken, hot)


# --- every cut and changed byte of real hot frames ------------------------------


def hot_samples() -> list[tuple[int, bytes]]:
    """(direction, raw) of real frames: a SEND, MESSAGE, SEND_RECEIPT, ACK and FLOW."""
    found: dict[int, tuple[int, bytes]] = {}
    for _, frames in golden_frames():
        for direction, frame in frames:
            if frame.ok and frame.type in HOT_TYPES:
                found.setdefault(frame.type, (direction, frame.raw[:600]))
    assert sorted(found) == HOT, sorted(found)
    return [found[t] for t in HOT]


@pytest.mark.parametrize("index", range(len(HOT)))
def test_every_cut_and_changed_byte_of_real_hot_frames_is_summarized_alike(index: int) -> None:
    """Cut anywhere (a recorded payload is cut, its prefix unchanged) and
    every byte changed, after a PRODUCER and a SUBSCRIBE that name topics."""
    direction, raw = hot_samples()[index]
    opening = [
        frame_record(1, 0, 0, encode(command(T("PRODUCER"), pb.CommandProducer(
            topic="persistent://t/n/p", producer_id=p, request_id=p)))) for p in range(4)
    ] + [
        frame_record(1, 0, 0, encode(command(T("SUBSCRIBE"), pb.CommandSubscribe(
            topic="persistent://t/n/c", subscription="s", consumer_id=c, request_id=10 + c,
            subType=pb.CommandSubscribe.Shared)))) for c in range(4)
    ] + [
        frame_record(1, 1, 1, encode(command(T("SUCCESS"), pb.CommandSuccess(request_id=r))))
        for r in (*range(4), *range(10, 14))
    ]  # fmt: skip
    variants = [raw[:cut] for cut in range(len(raw) + 1)]
    for i in range(len(raw)):
        for value in (0x00, 0x01, 0x02, 0x0E, 0x7F, 0x80, 0xFF):
            changed = bytearray(raw)
            changed[i] = value
            variants.append(bytes(changed))
    records = [
        frame_record(1, d, 2 + n, v)
        for n, v in enumerate(variants)
        for d in (direction, 1 - direction)
    ]
    assert assert_summarized_alike(opening + records) > 0


# --- hypothesis-made frames -------------------------------------------------------


@st.composite
def hot_frames(draw: st.DrawFn) -> bytes:
    """A hot frame with any fields: a command drawn from the schema, and for
    SEND and MESSAGE metadata with any of its fields (chunks included)."""
    if draw(st.booleans()):
        return encode(draw(commands([T("SEND_RECEIPT"), T("ACK"), T("FLOW")])))
    if draw(st.booleans()):
        return draw(payload_frames()).raw
    frame = draw(payload_frames(checksum=draw(st.booleans())))
    metadata = draw(message_of(pb.MessageMetadata.DESCRIPTOR))
    assert isinstance(metadata, pb.MessageMetadata)
    return encode_payload(frame.command, metadata, frame.payload, checksum=frame.checksum)


def _payload_offset(raw: bytes) -> int:
    frame = decode_frame(raw)
    return frame.payload_offset if frame.payload_offset >= 0 else len(raw)


@st.composite
def records_of(draw: st.DrawFn) -> list[Record]:
    """A connection's records: producers and consumers made (or not), then
    hot frames as recorded (payload kept, cut where it starts, or cut
    anywhere), some changed, either way, some with the recorder's extras."""
    records: list[Record] = [{"k": "conn", "c": 1, "t": 0, "w": 0, "client": "c", "broker": "b",
                              "kind": "proxied", "listener": "plain",
                              "producers": {0: "persistent://t/n/x"}, "consumers": {}}]  # fmt: skip
    for n, raw in enumerate(draw(st.lists(hot_frames(), min_size=1, max_size=8))):
        cut = draw(st.sampled_from(["whole", "payload", "anywhere"]))
        if cut == "payload":
            raw = raw[: _payload_offset(raw)]
        elif cut == "anywhere":
            raw = raw[: draw(st.integers(0, len(raw)))]
        if draw(st.integers(0, 4)) == 0:
            changed = bytearray(raw or b"\x00")
            changed[draw(st.integers(0, len(changed) - 1))] = draw(st.integers(0, 255))
            raw = bytes(changed)
        extra: dict[str, Any] = draw(st.sampled_from([
            {}, {"p": [10, b"\x01" * 32]}, {"p": [3]}, {"invalid": "ChecksumError", "why": "w"},
            {"redacted": True}]))  # fmt: skip
        for direction in draw(st.lists(st.sampled_from([0, 1]), min_size=1, max_size=2)):
            records.append(frame_record(1, direction, n, raw, **copy.deepcopy(extra)))
    return records


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(records_of())
def test_hypothesis_frames_as_recorded_are_summarized_alike(records: list[Record]) -> None:
    assert_summarized_alike(records)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_summarized_alike(raw: bytes) -> None:
    assert_summarized_alike([frame_record(1, 0, 1, raw), frame_record(1, 1, 2, raw)])


def test_records_that_are_not_what_the_format_says_fail_alike() -> None:
    """A record without its time or direction: the same error either way,
    wherever the reference reads them."""
    send = encode_payload(command(T("SEND"), pb.CommandSend(producer_id=0, sequence_id=1)),
                          pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1),
                          b"x")  # fmt: skip
    receipt = encode(
        command(T("SEND_RECEIPT"), pb.CommandSendReceipt(producer_id=0, sequence_id=1))
    )
    flow = encode(command(T("FLOW"), pb.CommandFlow(consumer_id=1, messagePermits=5)))
    records: list[Record] = []
    for raw in (send, receipt, flow):
        for direction in (0, 1):
            for missing in ("t", "d"):
                record = frame_record(1, direction, 1, raw)
                del record[missing]
                records.append(record)
            records.append(frame_record(1, direction, "soon", raw))
    assert assert_summarized_alike(records) == len(records)
