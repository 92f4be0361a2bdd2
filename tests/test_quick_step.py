"""The compiled relay step (rust/src/step.rs, ``PulsarConnection.quick``)
against the core's usual path, the reference, on the same reads over real
sockets: the same bytes come out each way, and the metrics, the send table
and the receipt times end the same. Reads the step does not carry whole
(cut frames, frames the scanner leaves to Python, an ACK asking for a
receipt) come back untouched for the usual path."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from msgpack import Unpacker
from prometheus_client import generate_latest

from sluice.protocols.core import Send, Taps
from sluice.protocols.faults import FaultAction, Match, Rule
from sluice.protocols.pulsar import Type, command, encode, encode_payload, pb
from sluice.protocols.pulsar.connection import PulsarConnection
from sluice.proxy.metrics import Metrics
from sluice.recording.format import PayloadPolicy, read_records, recording_files
from sluice.recording.triggers import Trigger
from sluice.recording.writer import Recorder, RecorderConfig
from tests.test_compiled_frames import Watcher, proxied, traffic

T = Type.Value


Ends = dict[bool, tuple[socket.socket, socket.socket, socket.socket]]


@contextmanager
def wires() -> Iterator[tuple[Ends, dict[bool, socket.socket]]]:
    """Per direction (from the client?): where its bytes are written, the
    socket the step reads, the one it writes; and where those are read back."""
    pairs = [socket.socketpair() for _ in range(4)]
    try:
        for pair in pairs:
            for s in pair:
                s.setblocking(False)
        yield (
            {
                True: (pairs[0][0], pairs[0][1], pairs[1][0]),
                False: (pairs[2][0], pairs[2][1], pairs[3][0]),
            },
            {True: pairs[1][1], False: pairs[3][1]},
        )
    finally:
        for pair in pairs:
            for s in pair:
                s.close()


def drain(s: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            got = s.recv(1 << 20)
        except BlockingIOError:
            return out
        if not got:
            return out
        out += got


def scraped(metrics: Metrics) -> list[str]:
    """The metrics as Prometheus reads them, but for the relay delay and
    when each series was created (times), in order (series come in the
    order they were first counted)."""
    text = generate_latest(metrics.exposed).decode()
    return sorted(
        line for line in text.splitlines()
        if "sluice_relay_delay" not in line and "_created{" not in line
        and not line.startswith("#")
    )  # fmt: skip


def one_read(
    core: Any,
    quick: bool,
    from_client: bool,
    ends: Ends,
    readers: dict[bool, socket.socket],
    data: bytes,
) -> tuple[bool, bytes]:
    """``data`` written to a direction and read once: by the core's step
    where it may (``quick``): (True, what came out the other end) when it
    carried the read whole; else (False, the read, for the core)."""
    writer, source, sink = ends[from_client]
    writer.sendall(data)
    step = core.quick(from_client) if quick else None
    if step is None:
        got = source.recv(1 << 20)
        assert got == data
        return False, got
    got = step.carry(source.fileno(), sink.fileno(), from_client, 1.5)
    if type(got) is int:
        assert got == len(data)
        return True, drain(readers[from_client])
    assert got == data, "a read not carried comes back as it was read"
    return False, got


def relay(
    reads: list[tuple[bool, bytes]],
    quick: bool,
    recorder: Recorder | None = None,
    connection: Callable[[Taps], PulsarConnection] = proxied,
) -> tuple[Any, int]:
    """``reads`` through a proxied core (``connection`` makes it), each read
    by the step where it may (``quick``), else by the core; what came out
    each way, the metrics and the send table; and how many reads the step
    carried whole."""
    metrics = Metrics()
    core = connection(Taps([metrics] if recorder is None else [metrics, recorder]))
    out: dict[bool, bytes] = {True: b"", False: b""}
    ended: list[Any] = []
    carried = 0
    with wires() as (ends, readers):
        for from_client, data in reads:
            if ended:  # the relay hangs up
                break
            whole, got = one_read(core, quick, from_client, ends, readers, data)
            if whole:
                carried += 1
                out[from_client] += got
                continue
            receive = core.receive_client if from_client else core.receive_broker
            for action in receive(got, 1.5):
                if type(action) is Send:
                    out[from_client] += action.data
                else:
                    ended.append(action)
    state = (core.correlator.sends.waiting(), core.in_flight_sends)
    return (out, ended, scraped(metrics), state), carried


def ack_and_flow(consumer: int, entry: int) -> bytes:
    """An ACK that asks for no receipt, and a FLOW: what consumers send."""
    mid = pb.MessageIdData(ledgerId=1, entryId=entry)
    ack = pb.CommandAck(consumer_id=consumer, ack_type=pb.CommandAck.Individual,
                        message_id=[mid])  # fmt: skip
    flow = pb.CommandFlow(consumer_id=consumer, messagePermits=10)
    return encode(command(T("ACK"), ack)) + encode(command(T("FLOW"), flow))


def send(producer: int, sequence: int, size: int) -> bytes:
    meta = pb.MessageMetadata(producer_name="p", sequence_id=sequence, publish_time=1)
    body = pb.CommandSend(producer_id=producer, sequence_id=sequence, num_messages=1)
    return encode_payload(command(T("SEND"), body), meta, b"x" * size)


def receipt(producer: int, sequence: int) -> bytes:
    body = pb.CommandSendReceipt(producer_id=producer, sequence_id=sequence)
    return encode(command(T("SEND_RECEIPT"), body))


def message(consumer: int, entry: int, in_batch: int) -> bytes:
    mid = pb.MessageIdData(ledgerId=1, entryId=entry)
    meta = pb.MessageMetadata(producer_name="p", sequence_id=entry, publish_time=1,
                              num_messages_in_batch=in_batch)  # fmt: skip
    body = pb.CommandMessage(consumer_id=consumer, message_id=mid)
    return encode_payload(command(T("MESSAGE"), body), meta, b"m" * 30)


# What a producer and a consumer say nearly all the time, read whole: the
# step carries every one of these.
EVERYDAY = [
    (True, send(1, 1000, 100) + send(2, 1001, 50) + send(9, 1002, 10)),
    (True, send(1, 1003, 100) + send(1, 1003, 100)),  # a chunked message's ids, twice
    (False, receipt(2, 1001) + receipt(1, 1000) + receipt(4, 4)),
    (False, message(5, 1, 1) + message(5, 2, 4) + message(6, 3, 1)),
    (True, ack_and_flow(5, 3) + ack_and_flow(7, 4)),
    (False, receipt(1, 1003)),
    (False, receipt(1, 1003) + receipt(1, 1003)),
]


@pytest.mark.parametrize("whole", [True, False], ids=["cut-between-frames", "cut-anywhere"])
@pytest.mark.parametrize("seed", range(4))
def test_reads_carried_in_one_call_come_out_as_through_the_core(seed: int, whole: bool) -> None:
    reads = EVERYDAY + traffic(seed, whole)
    by_step, carried = relay(reads, True)
    by_core, none = relay(reads, False)
    assert none == 0
    assert carried >= len(EVERYDAY), "the step carried reads"
    for a, b in zip(by_step, by_core, strict=True):
        assert a == b


def test_an_ack_that_asks_for_an_answer_goes_to_the_core() -> None:
    """An ACK with a request_id is a request the core's correlator keeps
    until the broker answers it: the read holding one goes the core's way,
    with the same output; the same ACK without one is carried."""
    mid = pb.MessageIdData(ledgerId=1, entryId=7)
    ack = pb.CommandAck(consumer_id=5, ack_type=pb.CommandAck.Individual, message_id=[mid])
    plain = encode(command(T("ACK"), ack))
    ack.request_id = 12
    asking = encode(command(T("ACK"), ack))
    for data, carries in ((plain, 1), (asking, 0), (plain + asking, 0), (asking + plain, 0)):
        reads = [(True, data), (True, plain)]
        by_step, carried = relay(reads, True)
        assert carried == carries + 1, data
        assert by_step == relay(reads, False)[0]


def test_a_read_ending_in_a_frame_begun_is_carried_and_the_rest_waits_for_the_next() -> None:
    frames = [send(1, s, 300) for s in range(3)]
    stream = b"".join(frames)
    edges = list(itertools.accumulate(map(len, frames)))
    cuts = sorted({*range(1, len(stream), 37), *(e + d for e in edges[:-1] for d in (-1, 1, 5))})
    for cut in cuts:
        reads = [(True, stream[:cut]), (True, stream[cut:]), (True, ack_and_flow(5, 1))]
        by_step, carried = relay(reads, True)
        by_core, _ = relay(reads, False)
        assert by_step == by_core, cut
        assert carried == 3, "each read carried, the cut frame with the second"
        assert by_step[0][True] == stream + ack_and_flow(5, 1)


def test_what_the_step_holds_goes_to_the_core_first_when_a_read_goes_its_way() -> None:
    first, second = send(1, 1, 40), send(2, 2, 40)
    ping = encode(command(T("PING")))
    for then in ("rule", "end", "ping"):
        outs = []
        for quick in (True, False):
            core, metrics = relaying()
            sent: list[Any] = []
            with wires() as (ends, readers):
                writer, source, sink = ends[True]
                writer.sendall(first + second[:9])
                step = core.quick(True) if quick else None
                if step is not None:
                    assert step.carry(source.fileno(), sink.fileno(), True, 1.5) == len(first) + 9
                    sent.append(drain(readers[True]))
                else:
                    sent += core.receive_client(source.recv(1 << 20), 1.5)
                if then == "rule":  # the core stands aside: the read is the core's
                    core.faults.add(Rule(Match(command="PING"), FaultAction.DROP, id="r"))
                    assert core.quick(True) is None
                    writer.sendall(second[9:])
                    sent += core.receive_client(source.recv(1 << 20), 1.6)
                elif then == "end":  # the end, in the middle of a frame
                    writer.shutdown(socket.SHUT_WR)
                    step = core.quick(True) if quick else None
                    got = step.carry(source.fileno(), sink.fileno(), True, 1.6) if step else b""
                    assert got == b""
                    try:
                        sent += core.receive_client(got, 1.6)
                    except Exception as exc:
                        sent.append(repr(exc))
                else:  # a frame the step leaves to the core, after the held one
                    writer.sendall(second[9:] + ping)
                    step = core.quick(True) if quick else None
                    got = step.carry(source.fileno(), sink.fileno(), True, 1.6) if step else None
                    if quick:  # the read comes back as it was read
                        assert got == second[9:] + ping
                    sent += core.receive_client(second[9:] + ping, 1.6)
            flat = b"".join(x if isinstance(x, bytes) else getattr(x, "data", b"") for x in sent)
            closes = [repr(x) for x in sent if not isinstance(x, (bytes, Send))]
            outs.append((flat, closes, scraped(metrics), core.in_flight_sends))
        assert outs[0] == outs[1], then
        if then != "end":
            assert outs[0][0].startswith(first + second), then


def test_a_frame_begun_in_a_read_the_core_took_goes_on_in_the_step() -> None:
    # A read that came the usual way (a hand back; a connection's first
    # reads) ended inside a frame. The step takes that start over, and the
    # reads after it are carried: each of them ends inside a frame too, and
    # with the start left in the decoder each would go the usual way.
    frames = [send(1, s, 300) for s in range(6)]
    stream = b"".join(frames)
    edges = set(itertools.accumulate(map(len, frames)))
    cuts = [0, 500, 1_100, 1_700, len(stream)]
    assert not edges & set(cuts[1:-1]), "every read but the last ends inside a frame"
    reads = [stream[a:b] for a, b in itertools.pairwise(cuts)]
    by_core, _ = relay([(True, data) for data in reads], False)
    core, metrics = relaying()
    out = b"".join(a.data for a in core.receive_client(reads[0], 1.5) if isinstance(a, Send))
    with wires() as (ends, readers):
        writer, source, sink = ends[True]
        for data in reads[1:]:
            writer.sendall(data)
            step = core.quick(True)
            assert step is not None
            assert step.carry(source.fileno(), sink.fileno(), True, 1.5) == len(data)
            out += drain(readers[True])
    assert out == stream == by_core[0][True]
    assert scraped(metrics) == by_core[2]
    assert (core.correlator.sends.waiting(), core.in_flight_sends) == by_core[3]


def test_a_frame_longer_than_the_step_holds_goes_to_the_decoder() -> None:
    big = send(1, 1, 600_000)
    reads = [(True, big[i : i + 200_000]) for i in range(0, len(big), 200_000)]
    reads.append((True, send(1, 2, 10)))
    by_step, carried = relay(reads, True)
    by_core, _ = relay(reads, False)
    assert by_step == by_core
    assert by_step[0][True] == big + send(1, 2, 10)
    assert carried >= 1


def records(recorder: Recorder) -> list[dict[str, Any]]:
    """The frame records queued, but for when each read was made (times)."""
    out = []
    recorder._take_queued()
    unpacker = Unpacker()
    unpacker.feed(b"".join(recorder._packed))
    for record in unpacker:
        assert record.pop("t") > 0 and record.pop("w") > 0
        out.append(record)
    return out


@pytest.mark.parametrize("payloads", list(PayloadPolicy))
@pytest.mark.parametrize("seed", range(3))
def test_reads_carried_while_recording_are_recorded_as_the_recorder_records_them(
    seed: int, payloads: PayloadPolicy, tmp_path: Path
) -> None:
    reads = EVERYDAY + traffic(seed, True)
    by = {}
    for quick in (True, False):
        recorder = Recorder(RecorderConfig(tmp_path / str(quick), payloads))
        result, carried = relay(reads, quick, recorder)
        by[quick] = (result, records(recorder), recorder.dropped_total)
        if quick:
            assert carried >= len(EVERYDAY), "the step carried reads"
    for a, b in zip(by[True], by[False], strict=True):
        assert a == b
    assert len(by[True][1]) > 50


def test_a_full_recorder_queue_drops_what_the_step_carried_and_counts_it(
    tmp_path: Path,
) -> None:
    roomy = Recorder(RecorderConfig(tmp_path, PayloadPolicy.HASH))
    relay(EVERYDAY, True, roomy)
    recorder = Recorder(RecorderConfig(tmp_path, PayloadPolicy.HASH, queue_frames=4))
    _, carried = relay(EVERYDAY, True, recorder)
    assert carried == len(EVERYDAY)
    assert recorder.queued >= 4 and recorder.dropped_total > 0
    # Every frame, queued or counted as dropped.
    assert recorder.queued + recorder.dropped_total == roomy.queued


@pytest.mark.parametrize("cap", [1, 900, 6000])
def test_carried_records_under_a_file_cap_are_written_whole_in_order(
    cap: int, tmp_path: Path
) -> None:
    """The records of a carried read are one entry of the recorder's queue
    (from its sink): a file cap takes such entries apart at the records'
    boundaries. Every file holds whole records, no more than the cap (but
    one record at least), each connection opened once, and the files
    together hold the frames the Python path records, in its order."""
    reads = EVERYDAY + traffic(2, True)
    by = {}
    for quick in (True, False):
        directory = tmp_path / str(quick)
        recorder = Recorder(RecorderConfig(directory, PayloadPolicy.FULL, max_file_bytes=cap))
        _, carried = relay(reads, quick, recorder)
        assert carried >= len(EVERYDAY) if quick else carried == 0

        async def write(recorder: Recorder = recorder, directory: Path = directory) -> None:
            directory.mkdir()
            recorder._take_queued()
            await recorder._write_packed()
            await recorder._close_file()

        trio.run(write)
        frames = []
        files = recording_files(directory)
        for path in files:
            records = list(read_records(path))  # raises on a record cut short
            assert records[0]["k"] == "header"
            opened = [r["c"] for r in records if r["k"] == "conn"]
            assert len(opened) == len(set(opened)), path
            if path.stat().st_size > cap:  # one record at least, beside restated openings
                assert len([r for r in records[1:] if r["k"] != "conn"]) <= 1, path
            frames += [(r["d"], r["raw"]) for r in records if r["k"] == "frame"]
        by[quick] = (frames, len(files))
        assert recorder.dropped_total == 0
    assert by[True][0] == by[False][0]
    assert len(by[True][0]) > 50
    if cap < 1000:
        assert by[True][1] > 20


def test_each_carried_read_is_timed_as_the_relay_times_a_read() -> None:
    reads = traffic(1, True)
    metrics = Metrics()
    core = proxied(Taps([metrics]))
    carried = {True: 0, False: 0}
    with wires() as (ends, _):
        for from_client, data in reads:
            writer, source, sink = ends[from_client]
            writer.sendall(data)
            step = core.quick(from_client)
            if step is None:  # a frame of the read before, cut: the usual way
                got = source.recv(1 << 20)
            else:
                got = step.carry(source.fileno(), sink.fileno(), from_client, 1.5)
                if type(got) is int:
                    carried[from_client] += 1
                    continue
            receive = core.receive_client if from_client else core.receive_broker
            receive(got, 1.5)
    value = metrics.exposed.get_sample_value
    for from_client, direction in ((True, "client_to_broker"), (False, "broker_to_client")):
        labels = {"direction": direction, "protocol": "pulsar"}
        assert carried[from_client] > 0
        count = value("sluice_relay_delay_seconds_count", labels)
        assert count == carried[from_client]


def relaying() -> tuple[PulsarConnection, Metrics]:
    metrics = Metrics()
    return proxied(Taps([metrics])), metrics


def test_what_the_socket_does_not_take_is_left_to_write_after_accounting() -> None:
    core, metrics = relaying()
    step = core.quick(True)
    assert step is not None
    data = b"".join(send(1, s, 6_000) for s in range(8))
    reader, sink = socket.socketpair()
    writer, source = socket.socketpair()
    with reader, sink, writer, source:
        for s in (sink, source, reader):
            s.setblocking(False)
        sink.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        writer.sendall(data)
        got = step.carry(source.fileno(), sink.fileno(), True, 2.0)
        assert type(got) is tuple
        read, rest, error, seconds = got
        assert read == len(data) and error is None and seconds >= 0
        written = drain(reader)
        assert 0 < len(written) < len(data) and written + rest == data
        # Accounted all the same: every SEND is in flight.
        assert core.in_flight_sends == 8
    metrics.absorb()
    assert metrics.traffic.frames[True][T("SEND")] == 8


def test_a_write_that_fails_comes_back_as_its_error_and_nothing_to_read_as_none() -> None:
    core, _ = relaying()
    step = core.quick(True)
    assert step is not None
    reader, sink = socket.socketpair()
    writer, source = socket.socketpair()
    with sink, writer, source:
        source.setblocking(False)
        assert step.carry(source.fileno(), sink.fileno(), True, 2.0) is None
        reader.close()
        writer.sendall(send(1, 1, 10))
        read, rest, error, _ = step.carry(source.fileno(), sink.fileno(), True, 2.0)
        assert read > 0 and rest == b"" and isinstance(error, BrokenPipeError)
        writer.close()
        assert step.carry(source.fileno(), sink.fileno(), True, 2.0) == b"", "the end"


def test_the_step_stands_aside_where_a_read_must_be_seen_frame_by_frame() -> None:
    slow = Trigger("slow-sends", "slow", command="SEND", slower_than=0.5)
    error = Trigger("errors", "error")
    core, _ = relaying()
    assert core.quick(True) is not None and core.quick(False) is not None
    # A frame half read waits in the decoder: the step takes it over...
    half = send(1, 1, 10)[:7]
    core.receive_client(half, 1.0)
    step = core.quick(True)
    assert step is not None and step.take_held(True) == half
    # ... unless it holds the start of one itself.
    core.receive_client(half, 1.0)
    assert step.give_held(True, b"\0\0")
    assert core.quick(True) is None and core.quick(False) is not None
    core.receive_client(half[2:], 1.0)  # what it held, then this: the frame whole
    assert step.take_held(True) == b"" and core.quick(True) is step
    # A fault rule sees every frame.
    core, _ = relaying()
    core.faults.add(Rule(Match(command="SEND"), FaultAction.DROP, id="r"))
    assert core.quick(True) is None
    # A tap other than the metrics and the recorder sees every frame.
    assert proxied(Taps([Metrics(), Watcher()])).quick(True) is None
    # A lossless recorder (the relay waits for room first), and a snapshot
    # rule on slow answers (it looks at each read's receipt times); a rule
    # on errors sees no read the step carries (answers with an error and
    # invalid frames are not hot).
    for config, quick in (
        (RecorderConfig(Path("."), lossless=True), False),
        (RecorderConfig(Path("."), ring_bytes=1 << 20, triggers=(slow,)), False),
        (RecorderConfig(Path("."), ring_bytes=1 << 20, triggers=(error,)), True),
    ):
        core = proxied(Taps([Metrics(), Recorder(config)]))
        assert (core.quick(True) is not None) is quick, config
    # Not relaying (any more).
    core, _ = relaying()
    core.closed("closed")
    assert core.quick(True) is None
