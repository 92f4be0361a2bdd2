"""The compiled step for what a Cursus broker streams, and for the plain
OK a commit waits for (rust/src/step.rs, ``CursusConnection.quick``),
against the core's usual path, the reference, on the same reads over real
sockets: the same bytes reach the client, the metrics end the same, and a
drain ends the stream at the same offset. Reads that are not what the
step checked (a reply, a batch the reference refuses, a cut frame too long
to hold) come back untouched for the usual path."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.addresses import Address
from sluice.protocols.core import Conn, Send, Taps
from sluice.protocols.cursus import Batch, Keepalive, Message, encode_reply, encode_request
from sluice.protocols.cursus.commands import BatchCommit, CommitOffset, List, Stream
from sluice.protocols.cursus.connection import CursusConnection, CursusRouting, CursusSettings
from sluice.protocols.cursus.replies import ErrorReply, OkReply, StreamControl
from sluice.protocols.faults import FaultAction, Match, Rule
from sluice.protocols.registry import get
from sluice.proxy.metrics import Metrics
from sluice.recording.writer import Recorder, RecorderConfig
from tests.helpers.cursus_strategies import batches
from tests.test_quick_step import one_read, scraped, wires

BROKER = Address("127.0.0.1", 9000)
STREAM = encode_request(Stream(topic="orders", partition=0, group="g", member="m"))


def delivery(topic: str, first: int, count: int, size: int = 40) -> bytes:
    messages = tuple(
        Message(offset=first + i, seq_num=i, producer_id="p", payload=bytes([i % 251]) * size)
        for i in range(count)
    )
    return encode_reply(Batch(topic=topic, partition=0, messages=messages))


KEEPALIVE = encode_reply(Keepalive())


def streaming(taps: list[Any]) -> CursusConnection:
    """A core whose client asked for a STREAM, answered by a first batch."""
    core = CursusConnection(
        Conn(1, "127.0.0.1:5000", "plain", "cursus"),
        CursusSettings(),
        CursusRouting(BROKER),
        Taps(taps),
    )
    core.receive_client(STREAM, 0.0)
    core.upstream_ready(0.5)
    core.receive_broker(delivery("orders", 0, 2), 1.0)
    return core


def relay(reads: list[bytes], quick: bool) -> tuple[Any, int]:
    """What the broker sent, read by read, through a streaming core: by the
    step where it may (``quick``), else by the core. What reached the
    client, how the connection ended, the metrics, where a drain ends the
    stream; and how many reads the step carried whole."""
    metrics = Metrics(protocol=get("cursus"))
    core = streaming([metrics])
    out = b""
    ended: list[Any] = []
    carried = 0
    with wires() as (ends, readers):
        for data in reads:
            if ended:
                break
            whole, got = one_read(core, quick, False, ends, readers, data)
            if whole:
                carried += 1
                out += got
                continue
            for action in core.receive_broker(got, 1.5):
                if type(action) is Send:
                    out += action.data
                else:
                    ended.append(action)
    drained = [a.data for a in core.drain() if type(a) is Send]
    return (out, ended, scraped(metrics), drained), carried


def cut(stream: bytes, rng: random.Random, reads: int) -> list[bytes]:
    points = sorted(rng.sample(range(1, len(stream)), reads - 1))
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]


@pytest.mark.parametrize("seed", range(8))
def test_stream_reads_carried_come_out_as_through_the_core(seed: int) -> None:
    rng = random.Random(seed)
    frames = []
    offset = 2
    for _ in range(30):
        if rng.random() < 0.2:
            frames.append(KEEPALIVE)
            continue
        count = rng.randrange(0, 5)
        topic = rng.choice(["orders", "billing", "ünïcode"])
        frames.append(delivery(topic, offset, count, rng.randrange(0, 3000)))
        offset += count
    reads = cut(b"".join(frames), rng, 12)
    compiled, carried = relay(reads, True)
    assert compiled == relay(reads, False)[0]
    assert carried >= 6, "most reads of deliveries are carried by the step"
    out, ended, metrics, drained = compiled
    assert out == b"".join(frames) and not ended
    assert any('command="BATCH"' in line and "broker_to_client" in line for line in metrics)
    assert drained == [encode_reply(StreamControl("CLOSE", "stopped", offset))]


def test_every_cut_of_a_stream_comes_out_as_through_the_core() -> None:
    frames = [delivery("orders", 2, 3), KEEPALIVE, delivery("billing", 5, 1)]
    stream = b"".join(frames)
    for point in range(1, len(stream)):
        reads = [stream[:point], stream[point:]]
        compiled, _ = relay(reads, True)
        assert compiled == relay(reads, False)[0], f"cut at {point}"


@pytest.mark.parametrize(
    "odd",
    [
        encode_reply(StreamControl("CLOSE", "replaced", 9)),
        encode_reply(ErrorReply.of("NOT_LEADER", "LEADER_IS", "10.0.0.9:9000")),
        b"\x00\x00\x00\x05\xba\x7c\x00\x01t",  # a batch the reference refuses
        b"\x00\x00\x00\x02OK",
    ],
    ids=["stream-control", "not-leader", "broken-batch", "reply"],
)
def test_what_is_not_a_delivery_goes_the_usual_way_and_ends_alike(odd: bytes) -> None:
    reads = [delivery("orders", 2, 2), delivery("orders", 4, 1) + odd[:3], odd[3:]]
    reads += [delivery("orders", 5, 1)]
    compiled, carried = relay(reads, True)
    assert compiled == relay(reads, False)[0]
    # The odd frame's read goes the usual way; the reads of deliveries around
    # it are carried, but after a reply naming a broker with no listener yet
    # (what follows it waits for one).
    assert carried == (2 if b"LEADER_IS" in odd else 3)


@given(st.lists(batches(), min_size=1, max_size=6), st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_any_batches_a_broker_streams_come_out_alike(items: list[Batch], rng: Any) -> None:
    stream = b"".join(encode_reply(i) for i in items)
    reads = cut(stream, rng, min(4, len(stream))) if len(stream) > 4 else [stream]
    assert relay(reads, True)[0] == relay(reads, False)[0]


def test_a_stream_with_any_byte_flipped_comes_out_as_through_the_core() -> None:
    """Mutations: whatever a flipped byte makes of a frame (a refused
    batch, a reply, another length), the step carries only what the
    reference takes for deliveries, and everything ends alike."""
    stream = delivery("orders", 2, 2, 3) + KEEPALIVE + delivery("bï", 4, 1, 2)
    for at in range(len(stream)):
        mutated = bytearray(stream)
        mutated[at] ^= 0x5A
        reads = [bytes(mutated[:20]), bytes(mutated[20:]), delivery("orders", 9, 1)]
        assert relay(reads, True)[0] == relay(reads, False)[0], f"byte {at} flipped"


def test_a_frame_longer_than_the_step_holds_goes_to_the_decoder() -> None:
    from sluice._frames import STEP_HOLD_MAX

    big = delivery("orders", 2, 3, STEP_HOLD_MAX // 2)
    third = len(big) // 3
    reads = [delivery("orders", 0, 0) + big[:third], big[third : 2 * third], big[2 * third :]]
    reads.append(delivery("orders", 5, 1))
    compiled, carried = relay(reads, True)
    assert compiled == relay(reads, False)[0]
    assert compiled[0] == delivery("orders", 0, 0) + big + delivery("orders", 5, 1)
    # The first read (its start held), and the last once the decoder gave
    # the big frame out; not the two that made it longer than a step holds.
    assert carried == 2


def test_the_step_stands_aside_for_a_client_faults_and_a_recorder(tmp_path: Any) -> None:
    metrics = Metrics(protocol=get("cursus"))
    core = streaming([metrics])
    assert core.quick(True) is None, "what a client sends is paired with its answers in Python"
    assert core.quick(False) is not None
    fresh = CursusConnection(
        Conn(2, "127.0.0.1:5000", "plain", "cursus"), CursusSettings(), CursusRouting(BROKER),
        Taps([metrics]),
    )  # fmt: skip
    assert fresh.quick(False) is None, "nothing is carried before a STREAM is answered"
    core.faults.add(Rule(Match(command="STREAM_CONTROL"), FaultAction.DROP, id="r"))
    assert core.quick(False) is None
    recorder = Recorder(RecorderConfig(tmp_path / "rec"), protocol=get("cursus"))
    assert streaming([metrics, recorder]).quick(False) is None, "recorded the Python way"


COMMIT = encode_request(
    CommitOffset(topic="orders", partition=0, group="g", offset=41, generation=1, member="m")
)
OK = b"\x00\x00\x00\x02OK"
BATCH_COMMIT = encode_request(
    BatchCommit(topic="orders", group="g", member="m", generation=1, offsets=((0, 41), (1, 7)))
)
BATCHED = encode_reply(OkReply.of(batched=2))


def commit(
    reads: list[bytes], quick: bool, again: bool = False, request: bytes = COMMIT
) -> tuple[Any, int]:
    """A consumer's commit: its COMMIT_OFFSET sent on, then what the broker
    answers, read by read (by the step where it may: ``quick``), a second
    commit sent after the first read if ``again``, and the client's close.
    What reached the client, the actions after, the metrics; and how many
    reads the step carried whole."""
    metrics = Metrics(protocol=get("cursus"))
    core = CursusConnection(
        Conn(1, "127.0.0.1:5000", "plain", "cursus"), CursusSettings(), CursusRouting(BROKER),
        Taps([metrics]),
    )  # fmt: skip
    core.receive_client(request, 0.0)
    sent = [a.data for a in core.upstream_ready(0.5) if type(a) is Send]
    out = b""
    carried = 0
    with wires() as (ends, readers):
        for n, data in enumerate(reads):
            whole, got = one_read(core, quick, False, ends, readers, data)
            if whole:
                carried += 1
                out += got
            else:
                out += b"".join(a.data for a in core.receive_broker(got, 1.5) if type(a) is Send)
            if again and n == 0:
                sent += [a.data for a in core.receive_client(request, 1.0) if type(a) is Send]
    ended = core.receive_client(b"", 2.0)
    return (sent, out, ended, scraped(metrics)), carried


@pytest.mark.parametrize(
    ("request_", "reads", "again", "carried"),
    [
        (COMMIT, [OK], False, 1),
        (COMMIT, [OK[:3], OK[3:]], False, 1),  # the start held by the step, then carried
        (COMMIT, [OK, OK], True, 2),  # a second commit on the same connection
        (COMMIT, [OK + OK], False, 0),  # (two answers to one request: the reference's)
        (COMMIT, [encode_reply(ErrorReply.of("OFFSET_REGRESSION"))], False, 0),
        (COMMIT, [BATCHED], False, 0),  # an OK with more to it
        (BATCH_COMMIT, [BATCHED], False, 1),
        (BATCH_COMMIT, [BATCHED[:7], BATCHED[7:]], False, 1),
        (BATCH_COMMIT, [BATCHED, BATCHED], True, 2),
        (BATCH_COMMIT, [OK], False, 0),
        (BATCH_COMMIT, [encode_reply(OkReply.of(batched="two"))], False, 0),
    ],
    ids=[
        "ok",
        "cut",
        "twice",
        "two-answers",
        "error",
        "other",
        "batched",
        "batched-cut",
        "batched-twice",
        "batched-plain",
        "batched-word",
    ],
)
def test_a_commits_ok_carried_comes_out_as_through_the_core(
    request_: bytes, reads: list[bytes], again: bool, carried: int
) -> None:
    compiled, took = commit(reads, True, again, request_)
    assert compiled == commit(reads, False, again, request_)[0]
    assert took == carried
    name = "COMMIT_OFFSET" if request_ is COMMIT else "BATCH_COMMIT"
    if carried:
        assert any(
            f'command="{name}"' in line and "_count" in line and line.endswith(f" {float(carried)}")
            for line in compiled[3]
        ), compiled[3]


def test_a_commits_ok_with_any_byte_flipped_comes_out_as_through_the_core() -> None:
    for request, answer in ((COMMIT, OK), (BATCH_COMMIT, BATCHED)):
        for at in range(len(answer)):
            mutated = bytearray(answer)
            mutated[at] ^= 0x5A
            reads = [bytes(mutated)]
            compiled = commit(reads, True, request=request)[0]
            assert compiled == commit(reads, False, request=request)[0], f"byte {at} flipped"


def test_the_step_waits_for_a_commits_answer_alone() -> None:
    """Only a commit is answered by a bare OK (or OK batched=N): the step
    is not offered for another request (its answer carries fields of its
    own), nor for two at once."""
    metrics = Metrics(protocol=get("cursus"))

    def waiting(*requests: bytes) -> CursusConnection:
        core = CursusConnection(
            Conn(1, "127.0.0.1:5000", "plain", "cursus"), CursusSettings(),
            CursusRouting(BROKER), Taps([metrics]),
        )  # fmt: skip
        core.receive_client(requests[0], 0.0)
        core.upstream_ready(0.5)
        for request in requests[1:]:
            core.receive_client(request, 0.6)
        return core

    assert waiting(COMMIT).quick(False) is not None
    assert waiting(BATCH_COMMIT).quick(False) is not None
    assert waiting(encode_request(List())).quick(False) is None
    assert waiting(COMMIT, COMMIT).quick(False) is None


def test_a_refusal_after_a_commits_ok_the_step_carried_goes_at_once() -> None:
    """The step carried the broker's OK to a commit; the request it
    answered was still queued until the next broker read. A refusal of the
    client's next request (an invalid batch) was queued behind it, and
    with nothing more from the broker, never sent: the client waited for
    ever."""
    from sluice.addresses import Address
    from sluice.protocols.core import Conn, Send, Taps
    from sluice.protocols.cursus import decode_stream
    from sluice.protocols.cursus.connection import (
        CursusConnection,
        CursusRouting,
        CursusSettings,
    )
    from sluice.protocols.cursus.replies import ErrorReply
    from sluice.protocols.registry import get
    from sluice.proxy.metrics import Metrics
    from tests.test_cursus_core import _corrupt_batch
    from tests.test_quick_step import one_read, wires

    core = CursusConnection(Conn(1, "127.0.0.1:5000", "plain", "cursus"), CursusSettings(),
                            CursusRouting(Address("127.0.0.1", 9000)),
                            Taps([Metrics(protocol=get("cursus"))]))  # fmt: skip
    core.receive_client(COMMIT, 0.0)
    core.upstream_ready(0.5)
    with wires() as (ends, readers):
        whole, got = one_read(core, True, False, ends, readers, OK)
    assert whole and got == OK
    out = core.receive_client(_corrupt_batch(), 1.0)
    data = b"".join(a.data for a in out if isinstance(a, Send))
    (reply,) = decode_stream(data, from_client=False)
    assert isinstance(reply.message, ErrorReply) and reply.message.code == "decode_failed"
