"""``sluice record anonymize``: a capture with distinctive names, hosts,
properties, keys and payloads, anonymized; its bytes searched for every
original; the result read by inspect, view, replay and serve; pseudonyms
the same under one key and different under another; bad input."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pulsar
import pytest

from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.protocols.pseudonyms import Pseudonyms
from sluice.recording.anonymize import Anonymizer, Options
from sluice.recording.format import read_records, recording_files
from sluice.view.index import Index
from tests.helpers.support import SLUICE, client, recorded_session
from tests.test_serve import start_serve, stop

pytestmark = pytest.mark.e2e  # every test here starts a process

TOPIC = "persistent://public/default/acme-secret-orders"
PRODUCER = "acme-billing-producer"
SUBSCRIPTION = "acme-audit-subscription"
CONSUMER = "acme-audit-consumer"
PROPERTY = ("customer-id", "acme-customer-4711")
KEY = "acme-partition-key-99"
PAYLOAD = "acme-payload-body"
# What must not be found anywhere in the anonymized capture's bytes.
ORIGINALS = ["acme", "secret-orders", "public", "default", "127.0.0.1", PRODUCER, SUBSCRIPTION,
             CONSUMER, PROPERTY[1], KEY, PAYLOAD]  # fmt: skip


def session(url: str) -> None:
    """Unbatched and batched sends with a key and a property, a named
    consumer on a named subscription, an unsubscribe."""
    with client(url) as c:
        consumer = c.subscribe(TOPIC, SUBSCRIPTION, consumer_name=CONSUMER,
                               initial_position=pulsar.InitialPosition.Earliest)  # fmt: skip
        producer = c.create_producer(TOPIC, producer_name=PRODUCER, batching_enabled=False)
        for i in range(5):
            producer.send(f"{PAYLOAD}-{i}".encode(), properties=dict([PROPERTY]),
                          partition_key=KEY)  # fmt: skip
        batched = c.create_producer(TOPIC, producer_name=PRODUCER + "-b", batching_enabled=True,
                                    batching_max_messages=3,
                                    batching_max_publish_delay_ms=200)  # fmt: skip
        done = threading.Semaphore(0)
        for i in range(6):
            batched.send_async(f"{PAYLOAD}-b{i}".encode(), lambda res, mid: done.release(),
                               properties=dict([PROPERTY]), partition_key=KEY)  # fmt: skip
        batched.flush()
        for _ in range(6):
            assert done.acquire(timeout=10)
        for _ in range(11):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        consumer.unsubscribe()


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    recording = recorded_session(tmp_path_factory.mktemp("anonymize"), session)
    found = b"".join(path.read_bytes() for path in recording_files(recording))
    assert all(o.encode() in found for o in ORIGINALS)  # the capture holds them all
    return recording


def anonymize(capture: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SLUICE, "record", "anonymize", str(capture), str(out), *extra],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def all_bytes(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file())


def test_no_original_is_left_and_every_reader_takes_the_result(
    capture: Path, tmp_path: Path
) -> None:
    out, report = tmp_path / "anon", tmp_path / "report.json"
    done = anonymize(capture, out, "--report", str(report))
    assert done.returncode == 0, done.stderr
    assert "payloads left out" in done.stderr
    data = all_bytes(out)
    left = [o for o in ORIGINALS if o.encode() in data]
    assert left == [], left
    # The report says what kinds were replaced, never the originals.
    text = report.read_text()
    assert [o for o in ORIGINALS if o in text] == []
    counts = json.loads(text)["replaced"]
    for kind in ("topic", "producer", "subscription", "consumer", "key", "value", "host"):
        assert counts.get(kind, 0) >= 1, counts
    # Every frame kept its command and its topic's shape; no payload is left.
    frames = [r for p in recording_files(out) for r in read_records(p) if r["k"] == "frame"]
    original = [r for p in recording_files(capture) for r in read_records(p) if r["k"] == "frame"]
    assert [f["s"]["cmd"] for f in frames] == [f["s"]["cmd"] for f in original]
    topics = {f["s"]["topic"] for f in frames if f["s"].get("topic")}
    assert len(topics) == 1 and topics.pop().startswith("persistent://tenant-")
    # Payloads: their shape kept, zeros for contents (--payloads filler).
    sends = [f for f in frames if f["s"]["cmd"] == "SEND"]
    unbatched = [f for f in sends if f["s"].get("msgs") == 1]
    assert len(unbatched) == 5 and len(sends) > 5
    assert all(f["raw"].endswith(bytes(len(PAYLOAD) + 2)) for f in unbatched)
    # inspect, view (its index), replay against a fresh broker, serve.
    inspect = subprocess.run([*SLUICE, "inspect", str(out)], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    assert inspect.returncode == 0 and "PRODUCER_SUCCESS" in inspect.stdout, inspect.stderr
    index = Index(out)
    index.build()
    assert index.error == "" and index.frames == len(frames)
    with EmbeddedBroker() as fresh:
        replayed = subprocess.run(
            [*SLUICE, "replay", str(out), "--broker", fresh.url, "--timeout", "3"],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "equivalent:" in replayed.stdout, replayed.stdout


def test_serve_answers_a_client_that_uses_the_pseudonyms(capture: Path, tmp_path: Path) -> None:
    out, report = tmp_path / "anon", tmp_path / "report.json"
    assert anonymize(capture, out, "--report", str(report), "--reveal").returncode == 0
    revealed = json.loads(report.read_text())["originals"]
    topic = revealed["topic"][TOPIC]
    subscription = revealed["subscription"][SUBSCRIPTION]
    port = free_port()
    process = start_serve(out, port, "--listen", f"127.0.0.1:{port}")
    try:
        with client(f"pulsar://127.0.0.1:{port}") as c:
            consumer = c.subscribe(topic, subscription, consumer_name="any",
                                   initial_position=pulsar.InitialPosition.Earliest)  # fmt: skip
            producer = c.create_producer(topic, batching_enabled=False)
            for i in range(5):
                producer.send(f"x-{i}".encode())
            got = [consumer.receive(timeout_millis=10_000) for _ in range(5)]
            assert len(got) == 5
    finally:
        code, text = stop(process)
    assert code == 0, text


def test_one_key_gives_the_same_pseudonyms_another_key_others(
    capture: Path, tmp_path: Path
) -> None:
    key = tmp_path / "key"
    runs = []
    for name in ("a", "b"):
        done = anonymize(capture, tmp_path / name, "--key-file", str(key), "--payloads", "none")
        assert done.returncode == 0, done.stderr
        runs.append(all_bytes(tmp_path / name))
    assert runs[0] == runs[1]
    assert b"sha256" not in runs[0]
    other = anonymize(capture, tmp_path / "c")
    assert other.returncode == 0
    assert all_bytes(tmp_path / "c") != runs[0]


def test_bad_input_is_one_line(capture: Path, tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = [
        ((str(tmp_path / "empty"), str(tmp_path / "o1")), "no recordings"),
        ((str(capture), str(tmp_path / "full")), "not an empty directory"),
        ((str(capture), str(capture / "inside")), "inside"),
        ((str(capture), str(tmp_path / "o2"), "--reveal"), "--reveal needs --report"),
    ]
    for args, said in cases:
        done = subprocess.run([*SLUICE, "record", "anonymize", *args], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 2, (args, done.stderr)
        assert said in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_free_text_and_web_paths_lose_their_names() -> None:
    """Without a broker: an HTTP exchange's path, headers and body, and an
    error message that names a topic seen elsewhere."""
    anonymizer = Anonymizer(Options(b"k" * 32, "hash"), "pulsar")
    names: Pseudonyms = anonymizer.names
    topic = names.topic("persistent://acme/billing/invoices-partition-2")
    assert topic.startswith("persistent://tenant-") and topic.endswith("-partition-2")
    http = anonymizer.record({
        "k": "http", "h": 1, "x": 1, "client": "10.9.8.7:5000", "t": 0, "w": 0,
        "method": "GET", "path": "/admin/v2/persistent/acme/billing/invoices/stats?x=acme",
        "kind": "admin", "status": 200,
        "req": {"h": [["host", "broker.acme.example:8080"], ["user-agent", "acme-cli"]], "n": 0},
        "res": {"h": [], "n": 5, "raw": b"acme!"},
        "hops": [["http://broker-2.acme.example:8080", "/admin/v2/namespaces/acme/billing"]],
    })  # fmt: skip
    text = json.dumps(http, default=str)
    for original in ("acme", "billing", "invoices", "10.9.8.7", "broker.acme"):
        assert original not in text, (original, text)
    assert http["res"]["p"][0] == 5 and "raw" not in http["res"]
    # Every forwarding header's address goes, and a Referer that is no URL
    # (a client may send any) is replaced whole (it stopped anonymize with
    # a traceback; Forwarded, X-Client-IP and True-Client-IP were kept).
    forwarded = anonymizer.record({
        "k": "http", "h": 1, "x": 2, "client": "10.9.8.7:5000", "t": 0, "w": 0,
        "method": "GET", "path": "/admin/v2/clusters", "kind": "admin", "status": 200,
        "req": {"h": [["forwarded", "for=192.0.2.60;proto=http, for=198.51.100.17"],
                      ["x-client-ip", "192.0.2.61"], ["true-client-ip", "192.0.2.62"],
                      ["referer", "http://[192.0.2.63/acme"]], "n": 0},
        "res": {"h": [], "n": 0},
    })  # fmt: skip
    text = json.dumps(forwarded, default=str)
    for original in ("192.0.2.", "198.51.100.17", "acme"):
        assert original not in text, (original, text)
    # A name that is also in its own pseudonym ("tenant" in "tenant-..."), or
    # a number in another's, does not change a pseudonym once it is written:
    # a web path names the topic as its frames do.
    named = names.topic("persistent://tenant/ns/orders")
    names.name("value", "973")
    names.name("value", "100")
    path = anonymizer.record({
        "k": "http", "h": 1, "x": 3, "client": "10.9.8.7:5000", "t": 0, "w": 0,
        "method": "GET", "path": "/admin/v2/persistent/tenant/ns/orders/stats", "kind": "admin",
        "status": 200, "req": {"h": [], "n": 0}, "res": {"h": [], "n": 0},
    })["path"]  # fmt: skip
    assert path == "/admin/v2/" + named.replace("://", "/") + "/stats", (path, named)

    # Every web path that names a tenant, namespace, topic (percent-encoded
    # too) or subscription, and the names a WebSocket session goes by (they
    # were kept unless frames had named them).
    def web(path: str) -> str:
        return str(anonymizer.record({
            "k": "http", "h": 1, "x": 4, "client": "10.9.8.7:5000", "t": 0, "w": 0,
            "method": "GET", "path": path, "kind": "admin", "status": 200,
            "req": {"h": [], "n": 0}, "res": {"h": [], "n": 0},
        })["path"])  # fmt: skip

    paths = (
        "/admin/v2/persistent/initech/labs/orders/subscription/audit-sub/skip_all",
        "/admin/v2/schemas/initech/labs/salaries/schema",
        "/admin/v2/namespaces/initech",
        "/admin/v2/persistent/initech/labs",
        "/lookup/v2/namespace/initech/labs/x",
        "/ws/v2/consumer/persistent/initech/labs/orders/audit-sub?consumerName=initech-c&x=1",
        "/ws/v2/producer/persistent/initech/labs/orders?producerName=initech-p",
        "/ws/v2/reader/persistent/t/n/x?readerName=initech-r",
    )
    for path in paths:
        for original in ("initech", "labs", "orders", "salaries", "audit-sub"):
            assert original not in web(path), (path, web(path))
    # A percent-encoded topic takes the pseudonym the topic has in frames.
    encoded = web("/admin/v2/persistent/initech/labs/my%20orders")
    assert encoded == "/admin/v2/" + names.topic("persistent://initech/labs/my orders").replace(
        "://", "/"
    )
    slow = "Topic persistent://acme/billing/invoices is slow"
    note = anonymizer.record({"k": "snapshot", "t": 0, "w": 0, "reason": slow})
    # Replaced whole: it may name what no field does (test_anonymize_gaps_reason.py).
    assert "acme" not in note["reason"] and note["reason"] == names.name("name", slow)
