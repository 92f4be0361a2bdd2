"""Fault injection: rules, the core carrying them out, the admin API and CLI.

The sans-I/O part feeds frames into the Pulsar core; the rest runs the real
proxy, the real pulsar-client and the pulsar-lite broker.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry

from sluice.addresses import Address
from sluice.brokers.embedded import free_port
from sluice.protocols.core import Close, FaultInjected, Hold, Peer, Send
from sluice.protocols.cursus import Batch, Message, encode_batch
from sluice.protocols.cursus import frame as cursus_frame
from sluice.protocols.faults import (
    MAX_RULES,
    FaultAction,
    FaultError,
    Faults,
    Match,
    Rule,
    load_rules,
    parse_rule,
    topic_matches,
)
from sluice.protocols.pulsar import Problem, pb
from sluice.proxy.admin import FaultsEndpoint, bound, open_admin, serve_admin
from sluice.proxy.config import PROTOCOL_FAULTS
from tests.test_cursus_core import relaying as cursus_relaying
from tests.test_cursus_core import sent as cursus_sent
from tests.test_pulsar_core import (
    closes,
    frame_bytes,
    make,
    names,
    proxied_core,
    send_frame,
    sent,
    with_producer,
)

TOKEN = "s3cret-admin-token"


def rule(**data: Any) -> Any:
    return parse_rule(data, PROTOCOL_FAULTS)


def core_with(*rules: Any, seed: int = 7) -> tuple[Any, Any, Faults]:
    core, rec = proxied_core()
    faults = Faults(seed=seed)
    faults.extend(rules)
    core.faults = faults
    return core, rec, faults


# --- rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"action": "explode"}, "action must be one of"),
        (
            {"match": {"command": "SEND_RECIEPT"}, "action": "drop"},
            "unknown command 'SEND_RECIEPT'",
        ),
        ({"match": {"direction": "sideways"}, "action": "drop"}, "match.direction must be"),
        ({"match": {"protocol": "kafka"}, "action": "drop"}, "unknown protocol 'kafka'"),
        ({"match": {"topik": "x"}, "action": "drop"}, "unknown match field(s): topik"),
        ({"action": "drop", "probability": 1.5}, "probability is between 0 and 1"),
        ({"action": "drop", "times": 0}, "times must be at least 1"),
        ({"action": "delay"}, "delay_ms > 0"),
        ({"action": "throttle"}, "rate must be at least 1"),
        ({"action": "error", "error": "Oops"}, "unknown error code 'Oops'"),
        ({"action": "error", "match": {"direction": "to_client"}}, "direction is to_broker"),
        ({"action": "drop", "delay": 3}, "unknown rule field(s): delay"),
        ({"action": "drop", "jitter_ms": 5}, "jitter_ms goes with a delay rule"),
        # A field of another action was dropped without a word.
        ({"action": "drop", "delay_ms": 300}, "delay_ms goes with a delay rule, not drop"),
        ({"action": "delay", "delay_ms": 5, "rate": 10}, "rate goes with a throttle rule"),
        ({"action": "disconnect", "error": "ServiceNotReady"}, "error goes with an error rule"),
        ({"action": "drop", "message": "gone"}, "message goes with an error rule, not drop"),
        ({"action": "drop", "probability": float("nan")}, "probability is a number"),
        ({"action": "delay", "delay_ms": float("inf")}, "delay_ms is a number"),
        ({"action": "delay", "delay_ms": 1e308}, "delay_ms must be at most 3600000"),
        ({"action": "delay", "delay_ms": 3_600_001}, "delay_ms must be at most 3600000"),
        ({"action": "delay", "delay_ms": 5, "jitter_ms": 4e6}, "jitter_ms must be at most"),
        ([1, 2], "a rule is a JSON object"),
        # Nothing answers a PING's or FLOW's error: accepted, it never fired.
        ({"action": "error", "match": {"command": "FLOW"}}, "FLOW is none (nothing answers"),
        (
            {"action": "error", "match": {"protocol": "pulsar", "command": "PING"}},
            "an error rule answers requests: PING is none",
        ),
    ],
)
def test_bad_rules_say_what_is_wrong(data: Any, message: str) -> None:
    with pytest.raises(FaultError) as info:
        parse_rule(data, PROTOCOL_FAULTS)
    assert message in str(info.value)


def test_a_rule_from_the_issue_parses_and_round_trips() -> None:
    data = {
        "match": {
            "protocol": "pulsar",
            "command": "SEND_RECEIPT",
            "topic": "persistent://public/default/orders-*",
            "direction": "to_client",
        },
        "action": "delay",
        "delay_ms": 300,
        "jitter_ms": 0,
        "probability": 1.0,
        "times": None,
    }
    parsed = rule(**data)
    again = rule(**{k: v for k, v in parsed.to_json().items() if k not in ("hits", "seen")})
    assert again.to_json() == parsed.to_json()
    assert parsed.to_json()["match"] == data["match"]


@pytest.mark.parametrize(
    "bad",
    ["my rule", "a?b", "a#b", "100%", "caf\u00e9", "x\u0000y", "two\nlines", "x" * 65, ".", ".."],
)
def test_rule_ids_are_names_a_url_and_a_log_line_take_as_they_are(bad: str) -> None:
    with pytest.raises(FaultError) as info:
        rule(action="drop", id=bad)
    message = str(info.value)
    assert "an id is 1 to 64 letters, digits" in message
    assert message.isprintable() and message.isascii()  # one line, nothing raw


def test_a_delay_of_an_hour_is_the_longest() -> None:
    assert rule(action="delay", delay_ms=3_600_000).delay_ms == 3_600_000


def test_good_rule_ids_pass() -> None:
    for good in ("f1", "slow-receipts", "a.b_C-9", "x" * 64, "...a", ".5"):
        assert rule(action="drop", id=good).id == good


def test_the_cli_quotes_an_id_and_says_why_a_call_cannot_be_made() -> None:
    from sluice.commands.faults import AdminError, call

    # An id http.client refuses in a URL: one line, not a traceback.
    with pytest.raises(AdminError, match="cannot call"):
        call(f"127.0.0.1:{free_port()}", "DELETE", "/faults/my rule")


def test_assigned_ids_skip_those_rules_hold() -> None:
    """Rules saved from GET /faults and loaded with --faults keep f1, f2:
    the next rule without an id gets f3, not a 'f1 exists already'."""
    faults = Faults()
    faults.extend([rule(action="drop", id="f1"), rule(action="drop", id="f2")])
    assert faults.add(rule(action="drop")).id == "f3"
    faults.add(rule(action="drop", id="f5"))
    assert [faults.add(rule(action="drop")).id for _ in range(2)] == ["f4", "f6"]


def test_client_globs_match_ipv4_and_ipv6_clients() -> None:
    def fires(pattern: str, client: str) -> bool:
        faults = Faults()
        faults.add(rule(match={"client": pattern}, action="drop"))
        return faults.check("pulsar", "SEND", True, client, lambda: None) is not None

    for pattern in ("::1", "::*", "[::1]:*", "[::1]:5000", "*"):
        assert fires(pattern, "[::1]:5000"), pattern
    assert fires("fe80::*", "[fe80::1%eth0]:6650")
    for pattern in ("127.*", "[::1]:6000", "::2"):
        assert not fires(pattern, "[::1]:5000"), pattern
    for pattern in ("127.*", "127.0.0.1", "127.0.0.1:5555", "[12]27.0.0.1"):
        assert fires(pattern, "127.0.0.1:5555"), pattern
    assert not fires("10.*", "127.0.0.1:5555")
    assert fires("::1", "::1")  # an IP alone
    # An IPv4 client on a dual-stack listener is matched as the IPv4 client.
    for pattern in ("127.*", "127.0.0.1:5555", "::ffff:127.0.0.1"):
        assert fires(pattern, "[::ffff:127.0.0.1]:5555"), pattern
    assert not fires("10.*", "[::ffff:127.0.0.1]:5555")


def test_topic_globs() -> None:
    assert topic_matches("orders-*", "persistent://public/default/orders-1")
    assert not topic_matches("orders-*", "persistent://public/default/invoices")
    assert topic_matches("persistent://public/*/orders-*", "persistent://public/default/orders-9")
    assert not topic_matches("orders-*", None)


def test_rules_file_errors_name_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    path.write_text(json.dumps([{"action": "drop"}, {"action": "nope"}]))
    with pytest.raises(FaultError, match=r"faults.json: rule 2: action must be one of"):
        load_rules(path, PROTOCOL_FAULTS)
    path.write_text("{not json")
    with pytest.raises(FaultError, match="not JSON"):
        load_rules(path, PROTOCOL_FAULTS)
    # What GET /faults answers loads back (counters dropped).
    path.write_text(json.dumps({"rules": [{"id": "slow", "action": "drop", "hits": 4}]}))
    (loaded,) = load_rules(path, PROTOCOL_FAULTS)
    assert (loaded.id, loaded.hits) == ("slow", 0)


# --- the core carries rules out ---------------------------------------------------------


def receipt(seq: int) -> bytes:
    return frame_bytes("SEND_RECEIPT", pb.CommandSendReceipt(producer_id=1, sequence_id=seq))


def test_delay_holds_matching_frames_and_keeps_order() -> None:
    core, rec, faults = core_with(
        rule(match={"command": "SEND_RECEIPT", "topic": "p*"}, action="delay", delay_ms=300)
    )
    with_producer(core, "persistent://t/n/p1")
    core.receive_client(send_frame(1, 0) + send_frame(1, 1), 2.0)
    pong = frame_bytes("PONG")
    out = core.receive_broker(pong + receipt(0) + receipt(1), 2.5)
    # PONG goes at once; each receipt waits until 300 ms after it arrived
    # (not 300 ms after the previous one), in order.
    kinds = [(type(a).__name__, a.until if isinstance(a, Hold) else None) for a in out]
    assert kinds[0] == ("Send", None)
    holds = [a.until for a in out if isinstance(a, Hold)]
    assert holds == [pytest.approx(2.8), pytest.approx(2.8)]
    assert names(out, Peer.CLIENT) == ["PONG", "SEND_RECEIPT", "SEND_RECEIPT"]
    assert isinstance(out[1], Hold) and isinstance(out[-1], Send)
    assert faults.rules[0].hits == 2
    injected = rec.of(FaultInjected)
    assert [(f.rule, f.action, f.command, f.topic) for f in injected] == [
        ("f1", "delay", "SEND_RECEIPT", "persistent://t/n/p1")
    ] * 2


def test_topic_rules_leave_other_topics_alone() -> None:
    core, _, faults = core_with(rule(match={"topic": "orders-*"}, action="drop"))
    with_producer(core, "persistent://t/n/invoices")
    core.receive_client(send_frame(1, 0), 2.0)
    assert names(core.receive_broker(receipt(0), 2.1), Peer.CLIENT) == ["SEND_RECEIPT"]
    assert faults.rules[0].hits == 0


def test_drop_makes_the_frame_vanish_both_ways() -> None:
    core, _, faults = core_with(rule(match={"command": "PONG"}, action="drop"))
    assert names(
        core.receive_broker(frame_bytes("PONG") + frame_bytes("PING"), 1.0), Peer.CLIENT
    ) == ["PING"]
    assert faults.rules[0].hits == 1


def test_corrupt_breaks_the_checksum_of_a_send() -> None:
    core, _, _ = core_with(rule(match={"command": "SEND"}, action="corrupt", times=1))
    with_producer(core)
    out = core.receive_client(send_frame(1, 0) + send_frame(1, 1), 2.0)
    first, second = sent(out, Peer.BROKER)
    assert first.error is not None and first.error.problem is Problem.CHECKSUM
    assert second.error is None
    assert core.in_flight_sends == 2  # the broker will answer both


def test_corrupt_adds_a_checksum_where_there_was_none() -> None:
    core, _, _ = core_with(rule(match={"command": "SEND"}, action="corrupt"))
    with_producer(core)
    out = core.receive_client(send_frame(1, 0, payload=b"abc", checksum=False), 2.0)
    (frame,) = sent(out, Peer.BROKER)
    assert frame.checksum is not None
    assert frame.error is not None and frame.error.problem is Problem.CHECKSUM
    assert bytes(frame.payload) == b"ab" + bytes([ord("c") ^ 0xFF])


def test_taps_see_a_fault_right_after_the_frame_it_acted_on() -> None:
    """The recorder notes a fault as acting on the frame recorded just
    before it: a read's frames reach the taps at once, except that those
    up to a fault come before the fault's event."""
    core, rec, _ = core_with(rule(match={"command": "SEND"}, action="drop", after=1, times=1))
    with_producer(core)
    rec.order.clear()
    out = core.receive_client(b"".join(send_frame(1, i) for i in range(4)), 2.0)
    assert [f.body.sequence_id for f in sent(out, Peer.BROKER)] == [0, 2, 3]
    assert rec.order == ["SEND", "SEND", "FaultInjected", "SEND", "SEND", "TopicTraffic"]
    # A long read is shown in parts: every frame once, in order, the fault's
    # event still right after its frame.
    core, rec, _ = core_with(rule(match={"command": "SEND"}, action="drop", after=69, times=1))
    with_producer(core)
    rec.order.clear()
    out = core.receive_client(b"".join(send_frame(1, i) for i in range(100)), 2.0)
    assert [f.body.sequence_id for f in sent(out, Peer.BROKER)] == [*range(69), *range(70, 100)]
    assert rec.order == ["SEND"] * 70 + ["FaultInjected"] + ["SEND"] * 30 + ["TopicTraffic"]
    assert len([frame for _, frame in rec.seen if frame.name == "SEND"]) == 100


def test_disconnect_after_the_hundredth_send() -> None:
    core, _, faults = core_with(
        rule(match={"command": "SEND"}, action="disconnect", after=99, times=1)
    )
    with_producer(core)
    out = core.receive_client(b"".join(send_frame(1, i) for i in range(120)), 2.0)
    assert len(sent(out, Peer.BROKER)) == 100  # the 100th goes, then the line is cut
    assert closes(out) == ["fault"]
    assert isinstance(out[-1], Close)
    assert faults.rules[0].hits == 1 and faults.rules[0].seen == 100


def test_error_answers_a_request_in_the_brokers_place() -> None:
    core, _, _ = core_with(rule(match={"command": "PRODUCER"}, action="error", times=1))
    producer = pb.CommandProducer(topic="persistent://t/n/p", producer_id=1, request_id=1)
    out = core.receive_client(frame_bytes("PRODUCER", producer), 1.0)
    assert names(out, Peer.BROKER) == []
    (answer,) = sent(out, Peer.CLIENT)
    assert answer.name == "ERROR"
    assert (answer.body.request_id, answer.body.error) == (1, pb.ServiceNotReady)
    assert "injected" in answer.body.message
    # The client's retry goes through.
    producer.request_id = 2
    assert names(core.receive_client(frame_bytes("PRODUCER", producer), 2.0), Peer.BROKER) == [
        "PRODUCER"
    ]


def test_error_on_send_is_a_send_error() -> None:
    core, _, _ = core_with(
        rule(match={"command": "SEND"}, action="error", error="PersistenceError", times=1)
    )
    with_producer(core)
    out = core.receive_client(send_frame(1, 5), 2.0)
    (answer,) = sent(out, Peer.CLIENT)
    assert answer.name == "SEND_ERROR"
    assert (answer.body.sequence_id, answer.body.error) == (5, pb.PersistenceError)
    assert core.in_flight_sends == 0


def test_error_rules_naming_no_protocol_keep_to_codes_their_protocols_know() -> None:
    # A Cursus code for a Pulsar command: refused, not a crash per PRODUCER.
    with pytest.raises(FaultError, match="unknown error code 'NOT_LEADER' for pulsar"):
        rule(match={"command": "PRODUCER"}, action="error", error="NOT_LEADER")
    # A code one protocol knows on a rule both may act on: that protocol's
    # cores answer with it, the other's pass the rule by (a saved rule set of
    # a Pulsar proxy, written with "error": "ServiceNotReady", loads again).
    assert rule(action="error", error="NOT_LEADER").error == "NOT_LEADER"
    assert rule(match={"command": "ACK"}, action="error", error="ServiceNotReady").error
    assert rule(match={"topic": "orders-*"}, action="error", error="ServiceNotReady").error
    assert rule(match={"command": "BATCH"}, action="error", error="NOT_LEADER").error
    # The default is that of the protocol the command belongs to...
    assert rule(match={"command": "BATCH"}, action="error").error == "NOT_LEADER"
    assert rule(match={"command": "LOOKUP"}, action="error").error == "ServiceNotReady"
    # ... or, where both may answer, each protocol's own (and it round-trips).
    either = rule(action="error")
    assert either.error == "" and either.to_json()["error"] is None
    again = rule(**{k: v for k, v in either.to_json().items() if k not in ("hits", "seen")})
    assert again.to_json() == either.to_json()


def test_error_rules_answer_with_the_frames_own_protocols_code() -> None:
    # Pulsar: a rule for both protocols answers ServiceNotReady.
    core, _, _ = core_with(rule(action="error", times=1))
    producer = pb.CommandProducer(topic="persistent://t/n/p", producer_id=1, request_id=1)
    (answer,) = sent(core.receive_client(frame_bytes("PRODUCER", producer), 1.0), Peer.CLIENT)
    assert (answer.name, answer.body.error) == ("ERROR", pb.ServiceNotReady)
    # Cursus: the same rule answers NOT_LEADER, never a Pulsar name.
    cursus, _ = cursus_relaying()
    cursus.faults = Faults()
    cursus.faults.add(rule(action="error"))
    batch = cursus_frame(encode_batch(Batch("t", 0, messages=(Message(payload=b"x"),))))
    answered = cursus_sent(cursus.receive_client(batch, 0.3), Peer.CLIENT)
    assert answered.startswith(b"ERROR: NOT_LEADER", 4), answered


def test_a_core_passes_by_an_error_rule_with_a_code_it_does_not_know() -> None:
    # Rules made in code (or by a newer supervisor) skip validation: a code
    # the protocol lacks lets the frame through instead of failing it.
    alien = Rule(Match(command="PRODUCER"), FaultAction.ERROR, id="alien", error="NOT_LEADER")
    core, _, faults = core_with()
    faults.add(alien)
    producer = pb.CommandProducer(topic="persistent://t/n/p", producer_id=1, request_id=1)
    out = core.receive_client(frame_bytes("PRODUCER", producer), 1.0)
    assert names(out, Peer.BROKER) == ["PRODUCER"] and not closes(out)
    assert (alien.hits, alien.seen) == (0, 0)
    cursus, _ = cursus_relaying()
    cursus.faults = Faults()
    cursus.faults.add(Rule(Match(command="BATCH"), FaultAction.ERROR, error="ServiceNotReady"))
    batch = cursus_frame(encode_batch(Batch("t", 0, messages=(Message(payload=b"x"),))))
    assert cursus_sent(cursus.receive_client(batch, 0.3), Peer.BROKER) == batch


def test_throttle_paces_frames_at_the_rate() -> None:
    core, _, _ = core_with(rule(match={"command": "SEND"}, action="throttle", rate=10_000))
    with_producer(core)
    frames = b"".join(send_frame(1, i, payload=b"x" * 900) for i in range(5))
    size = len(send_frame(1, 0, payload=b"x" * 900))
    out = core.receive_client(frames, 10.0)
    holds = [a.until for a in out if isinstance(a, Hold)]
    assert holds == [pytest.approx(10.0 + i * size / 10_000) for i in range(5)]


def test_lookup_connections_get_faults_too() -> None:
    core, _ = make()
    faults = Faults()
    faults.add(rule(match={"command": "LOOKUP"}, action="error", times=1))
    faults.add(rule(match={"command": "PONG"}, action="drop"))
    core.faults = faults
    connect = pb.CommandConnect(client_version="t", protocol_version=21)
    core.receive_client(frame_bytes("CONNECT", connect), 0.0)
    lookup = pb.CommandLookupTopic(topic="persistent://t/n/x", request_id=1)
    out = core.receive_client(frame_bytes("LOOKUP", lookup), 0.1)
    (answer,) = sent(out, Peer.CLIENT)
    assert answer.name == "LOOKUP_RESPONSE"
    assert answer.body.response == pb.CommandLookupTopicResponse.Failed
    assert answer.body.error == pb.ServiceNotReady
    # The proxy's own PONG to a PING vanishes.
    assert core.receive_client(frame_bytes("PING"), 0.2) == []
    # Frames Sluice writes itself are held on the connection's clock.
    faults.add(rule(match={"command": "PONG"}, action="delay", delay_ms=500, id="slow"))
    faults.remove("f2")
    out = core.receive_client(frame_bytes("PING"), 7.0)
    assert out[0] == Hold(7.5) and names(out, Peer.CLIENT) == ["PONG"]


def test_probability_stays_within_the_binomial_bound() -> None:
    core, _, faults = core_with(
        rule(match={"command": "SEND"}, action="drop", probability=0.1), seed=12345
    )
    with_producer(core)
    n = 10_000
    passed = 0
    for start in range(0, n, 500):
        data = b"".join(send_frame(1, i) for i in range(start, start + 500))
        passed += len(sent(core.receive_client(data, 2.0), Peer.BROKER))
    hits = faults.rules[0].hits
    assert hits + passed == n
    # Mean 1000, standard deviation 30: five of them either way.
    assert abs(hits - n * 0.1) <= 5 * math.sqrt(n * 0.1 * 0.9), hits


def test_no_rules_no_fault_work() -> None:
    core, rec, _ = core_with()
    with_producer(core)
    data = send_frame(1, 0)
    out = core.receive_client(data, 2.0)
    # The read goes on as it came, unsplit.
    assert out == [Send(Peer.BROKER, data)]
    assert not rec.of(FaultInjected)


# --- the admin API ---------------------------------------------------------------------


async def http(
    address: Address, method: str, path: str, body: bytes = b"", token: str | None = None
) -> tuple[int, str]:
    stream = await trio.open_tcp_stream(address.host, address.port)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {address}\r\n{auth}Content-Length: {len(body)}\r\n\r\n"
    )
    await stream.send_all(head.encode() + body)
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    await stream.aclose()
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest.split(b"\r\n\r\n", 1)[1].decode()


async def test_admin_api_adds_lists_and_removes_rules() -> None:
    faults = Faults()
    listeners = await open_admin(Address("127.0.0.1", 0))
    address = bound(listeners)
    endpoint = FaultsEndpoint(faults, PROTOCOL_FAULTS, TOKEN)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_admin, listeners, CollectorRegistry(), list, {"/faults": endpoint})
        good = json.dumps({"match": {"command": "SEND_RECEIPT"}, "action": "delay",
                           "delay_ms": 300}).encode()  # fmt: skip
        status, text = await http(address, "POST", "/faults", good)
        assert status == 401 and "admin token" in text
        status, text = await http(address, "POST", "/faults", good, token="wrong")
        assert status == 401
        status, text = await http(address, "POST", "/faults", b"{nope", token=TOKEN)
        assert status == 400 and "not JSON" in text
        # Nested past what Python reads: a 400 too (it was a 500 and a traceback).
        deep = b"[" * 20_000 + b"]" * 20_000
        status, text = await http(address, "POST", "/faults", deep, token=TOKEN)
        assert status == 400 and "nested too deep" in text
        bad = json.dumps({"match": {"command": "SENDD"}, "action": "drop"}).encode()
        status, text = await http(address, "POST", "/faults", bad, token=TOKEN)
        assert status == 400 and "unknown command 'SENDD'" in text
        status, text = await http(address, "POST", "/faults", good, token=TOKEN)
        assert status == 201 and json.loads(text)["id"] == "f1"
        assert faults.rules[0].delay_ms == 300
        faults.rules[0].hits = 3
        status, text = await http(address, "GET", "/faults")  # reading needs no token
        assert status == 200
        (listed,) = json.loads(text)["rules"]
        assert (listed["id"], listed["hits"], listed["action"]) == ("f1", 3, "delay")
        status, _ = await http(address, "DELETE", "/faults/f9", token=TOKEN)
        assert status == 404
        status, _ = await http(address, "DELETE", "/faults/f1")
        assert status == 401 and faults.rules
        status, text = await http(address, "DELETE", "/faults/f1", token=TOKEN)
        assert status == 200 and not faults.rules
        # Ids come percent-encoded (as the CLI sends them).
        named = json.dumps({"action": "drop", "id": "r.1"}).encode()
        assert (await http(address, "POST", "/faults", named, token=TOKEN))[0] == 201
        status, text = await http(address, "DELETE", "/faults/r%2E1", token=TOKEN)
        assert status == 200 and not faults.rules
        await http(address, "POST", "/faults", good, token=TOKEN)
        await http(address, "POST", "/faults", good, token=TOKEN)
        # /faults/ names no rule: refused, not taken for every rule.
        status, text = await http(address, "DELETE", "/faults/", token=TOKEN)
        assert status == 400 and "no rule id" in text and len(faults.rules) == 2
        status, text = await http(address, "DELETE", "/faults", token=TOKEN)
        assert status == 200 and json.loads(text) == {"deleted": 2}
        status, text = await http(address, "PUT", "/faults", good, token=TOKEN)
        assert status == 405
        nursery.cancel_scope.cancel()


async def test_the_admin_endpoint_holds_at_most_a_thousand_rules(tmp_path: Path) -> None:
    """Every frame is checked against every rule: rules added in a loop
    (no bound before) would slow each connection without end."""
    faults = Faults()
    faults.extend(rule(action="drop") for _ in range(MAX_RULES))
    listeners = await open_admin(Address("127.0.0.1", 0))
    address = bound(listeners)
    endpoint = FaultsEndpoint(faults, PROTOCOL_FAULTS, TOKEN)
    drop = json.dumps({"action": "drop"}).encode()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_admin, listeners, CollectorRegistry(), list, {"/faults": endpoint})
        status, text = await http(address, "POST", "/faults", drop, token=TOKEN)
        assert status == 400 and "at most 1000 fault rules" in text
        assert len(faults.rules) == MAX_RULES == 1000
        assert (await http(address, "DELETE", "/faults/f1", token=TOKEN))[0] == 200
        status, text = await http(address, "POST", "/faults", drop, token=TOKEN)
        assert status == 201 and len(faults.rules) == 1000
        nursery.cancel_scope.cancel()
    many = tmp_path / "rules.json"
    many.write_text(json.dumps([{"action": "drop"}] * (MAX_RULES + 1)))
    with pytest.raises(FaultError, match="1001 rules, at most 1000"):
        load_rules(many, PROTOCOL_FAULTS)
    many.write_text(json.dumps([{"action": "drop"}] * MAX_RULES))
    assert len(load_rules(many, PROTOCOL_FAULTS)) == MAX_RULES


async def test_without_a_token_file_rules_cannot_be_changed() -> None:
    faults = Faults()
    listeners = await open_admin(Address("127.0.0.1", 0))
    address = bound(listeners)
    endpoint = FaultsEndpoint(faults, PROTOCOL_FAULTS, None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_admin, listeners, CollectorRegistry(), list, {"/faults": endpoint})
        body = json.dumps({"action": "drop"}).encode()
        status, text = await http(address, "POST", "/faults", body, token="anything")
        assert status == 403 and "--admin-token-file" in text
        assert not faults.rules
        nursery.cancel_scope.cancel()


@pytest.mark.e2e
def test_faults_cli_usage_errors(tmp_path: Path) -> None:
    from tests.helpers.support import SLUICE

    def sluice(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*SLUICE, "faults", *args], capture_output=True, text=True,
                              timeout=60)  # fmt: skip

    port = free_port()  # nothing listens there
    done = sluice("list", "--admin", f"127.0.0.1:{port}")
    assert done.returncode == 1
    assert "cannot reach the admin endpoint" in done.stderr and "Traceback" not in done.stderr
    done = sluice("add", "--admin", f"127.0.0.1:{port}", "--delay", "soon")
    assert done.returncode == 2 and "not a duration: 'soon'" in done.stderr
    done = sluice("add", "--admin", f"127.0.0.1:{port}")
    assert done.returncode == 2 and "one of the arguments" in done.stderr
    done = sluice("remove", "--admin", f"127.0.0.1:{port}", "")  # not "every rule"
    assert done.returncode == 2 and "remove needs a rule id" in done.stderr
    done = sluice("remove", "--admin", f"127.0.0.1:{port}", "my rule")  # quoted, then sent
    assert done.returncode == 1 and "cannot reach the admin endpoint" in done.stderr
    assert "Traceback" not in done.stderr
    empty = tmp_path / "token"
    empty.write_text("")
    done = sluice("clear", "--admin", f"127.0.0.1:{port}", "--admin-token-file", str(empty))
    assert done.returncode == 2 and "the file is empty" in done.stderr


def test_an_error_rule_on_acks_answers_only_an_ack_that_asks_for_an_answer() -> None:
    """An ACK asks for a receipt only with a request id. The rule matched
    any ACK: `times 1` spent its only hit on one with none (relayed, as
    nothing could answer it), and a fault record told replay to withhold an
    ACK the broker got."""
    core, _, faults = core_with(rule(match={"command": "ACK"}, action="error", times=1))
    ids = pb.MessageIdData(ledgerId=1, entryId=2)
    plain = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual, message_id=[ids])
    assert names(core.receive_client(frame_bytes("ACK", plain), 1.0), Peer.BROKER) == ["ACK"]
    assert faults.rules[0].hits == 0
    asking = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual, message_id=[ids],
                           request_id=5)  # fmt: skip
    out = core.receive_client(frame_bytes("ACK", asking), 1.1)
    assert names(out, Peer.BROKER) == [] and names(out, Peer.CLIENT)
    assert faults.rules[0].hits == 1
