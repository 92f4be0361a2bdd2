"""``sluice record anonymize`` keeps no credential a capture holds, whatever
Sluice recorded it: older versions wrote CONNECT's and AUTH_*'s auth data,
credential-like property values and HTTP credentials as they came, and
today's leaves the properties inside a batch as they are with
``--record-payloads full``. Captures are built here with the recorder's own
format functions, each credential a distinct string, and the copy's bytes
are searched for every one of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.protocols.pulsar import encode, encode_payload, pb
from sluice.protocols.pulsar.payload import build_batch
from sluice.recording import format as fmt
from sluice.recording.anonymize import Options, anonymize
from sluice.recording.format import PayloadPolicy, read_records, recording_files

KEY = b"k" * 32
TOPIC = "persistent://acme/billing/invoices"


def frame(raw: bytes, direction: int = 0) -> fmt.Record:
    """A frame record as a recorder that kept every byte would write it."""
    return {"k": "frame", "c": 1, "d": direction, "t": 1, "w": 1, "n": len(raw), "raw": raw}


def kv(pairs: dict[str, str]) -> list[pb.KeyValue]:
    return [pb.KeyValue(key=k, value=v) for k, v in pairs.items()]


def pulsar_frames() -> tuple[list[fmt.Record], list[str]]:
    """Frames holding one credential each (and their originals)."""
    secrets: list[str] = []

    def secret(name: str) -> str:
        value = f"SECRET{len(secrets):02d}{name}"
        secrets.append(value)
        return value

    records: list[fmt.Record] = []
    cmd = pb.BaseCommand(type=pb.BaseCommand.CONNECT)
    cmd.connect.client_version, cmd.connect.protocol_version = "2.11", 19
    cmd.connect.auth_method_name = "token"
    cmd.connect.auth_data = secret("connectAuthData").encode()
    cmd.connect.original_principal = "proxy-role"
    cmd.connect.original_auth_data = secret("connectOriginalAuthData")
    cmd.connect.original_auth_method = "token"
    records.append(frame(encode(cmd)))

    cmd = pb.BaseCommand(type=pb.BaseCommand.AUTH_CHALLENGE)
    cmd.authChallenge.challenge.auth_method_name = "sasl"
    cmd.authChallenge.challenge.auth_data = secret("challengeData").encode()
    records.append(frame(encode(cmd), 1))

    cmd = pb.BaseCommand(type=pb.BaseCommand.AUTH_RESPONSE)
    cmd.authResponse.response.auth_method_name = "sasl"
    cmd.authResponse.response.auth_data = secret("responseData").encode()
    records.append(frame(encode(cmd)))

    cmd = pb.BaseCommand(type=pb.BaseCommand.LOOKUP)
    cmd.lookupTopic.topic, cmd.lookupTopic.request_id = TOPIC, 1
    cmd.lookupTopic.original_auth_data = secret("lookupOriginalAuthData")
    records.append(frame(encode(cmd)))

    cmd = pb.BaseCommand(type=pb.BaseCommand.PARTITIONED_METADATA)
    cmd.partitionMetadata.topic, cmd.partitionMetadata.request_id = TOPIC, 2
    cmd.partitionMetadata.original_auth_data = secret("partitionsOriginalAuthData")
    records.append(frame(encode(cmd)))

    cmd = pb.BaseCommand(type=pb.BaseCommand.PRODUCER)
    cmd.producer.topic, cmd.producer.producer_id, cmd.producer.request_id = TOPIC, 1, 3
    cmd.producer.metadata.extend(kv({"api-token": secret("producerMetadata"), "region": "eu"}))
    records.append(frame(encode(cmd)))

    cmd = pb.BaseCommand(type=pb.BaseCommand.SUBSCRIBE)
    sub = cmd.subscribe
    sub.topic, sub.subscription, sub.subType = TOPIC, "audit", pb.CommandSubscribe.Shared
    sub.consumer_id, sub.request_id = 1, 4
    sub.metadata.extend(kv({"session-id": secret("subscribeMetadata")}))
    sub.subscription_properties.extend(kv({"password": secret("subscriptionProperty")}))
    records.append(frame(encode(cmd)))

    send = pb.BaseCommand(type=pb.BaseCommand.SEND)
    send.send.producer_id, send.send.sequence_id = 1, 1
    meta = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1)
    meta.properties.extend(kv({"x-auth-token": secret("messageProperty"), "region": "eu"}))
    records.append(frame(encode_payload(send, meta, b"hello")))

    entries = []
    for n, name in enumerate(("batchSecret", "batchJwt")):
        single = pb.SingleMessageMetadata(payload_size=5, sequence_id=n)
        single.properties.extend(kv({name.replace("batch", "").lower(): secret(name)}))
        entries.append((single, b"hello"))
    batch = pb.MessageMetadata(producer_name="p", sequence_id=2, publish_time=1,
                               num_messages_in_batch=2)  # fmt: skip
    send.send.sequence_id, send.send.num_messages = 2, 2
    records.append(frame(encode_payload(send, batch, build_batch(entries))))
    return records, secrets


def http_records() -> tuple[list[fmt.Record], list[str]]:
    """HTTP exchanges and WebSocket frames as an older recorder (which did
    not redact them) wrote them."""
    secrets = [f"SECRET{n:02d}web" for n in range(11)]
    exchange: fmt.Record = {
        "k": "http", "h": 1, "x": 1, "client": "10.9.8.7:5000", "t": 0, "w": 0,
        "te": 0, "method": "GET", "path": f"/admin/v2/tenants?token={secrets[0]}&x=1",
        "kind": "admin",
        "status": 307,
        "req": {"h": [["Authorization", f"Bearer {secrets[1]}"], ["Cookie", f"s={secrets[2]}"],
                      ["X-Api-Key", secrets[3]],
                      ["Referer", f"http://user:{secrets[4]}@console.example/p?jwt={secrets[5]}"]],
                "n": 0},
        "res": {"h": [["Location", f"/admin/v2/tenants?access_token={secrets[6]}"],
                      ["Set-Cookie", f"id={secrets[7]}"],
                      ["Content-Type", "application/json"]],
                "n": 32, "raw": f'{{"token":"{secrets[8]}"}}'.encode()},
        "hops": [["http://broker-2.example:8080", f"/admin/v2/tenants?token={secrets[9]}"]],
    }  # fmt: skip
    ws: fmt.Record = {"k": "ws", "h": 1, "d": 0, "t": 0, "w": 0, "op": "text", "n": 30,
                      "raw": f'{{"password":"{secrets[10]}"}}'.encode()}  # fmt: skip
    return [exchange, ws], secrets


def capture(path: Path, records: list[fmt.Record], payloads: PayloadPolicy) -> Path:
    head = fmt.header(capture="0123456789ab", segment=1, started_ns=1,
                      payloads=payloads, sluice_version="0.1")  # fmt: skip
    conn = {"k": "conn", "c": 1, "client": "10.1.2.3:4000", "kind": "proxied",
            "broker": "pulsar://broker:6650", "listener": "plain", "t": 1, "w": 1}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(fmt.dumps([head, conn, *records]))
    return path


def copied(out: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file())


@pytest.mark.parametrize("payloads", ["filler", "hash", "none"])
@pytest.mark.parametrize("values", [("*",), ("region",), ()])
def test_no_pulsar_credential_reaches_the_copy(
    tmp_path: Path, payloads: str, values: tuple[str, ...]
) -> None:
    """CONNECT's, AUTH_*'s, a lookup's auth data, credential-like values of
    command metadata, a subscription's properties, a message's and a batch
    entry's properties: none in the copy, whichever property values the
    user chose to replace (a narrower --property-values kept them as they
    were; the auth data was kept whatever the options)."""
    records, secrets = pulsar_frames()
    source = capture(tmp_path / "in.sluice", records, PayloadPolicy.FULL)
    out = tmp_path / "out"
    report, names = anonymize(source, out, Options(KEY, payloads, property_values=values))
    data = copied(out)
    for secret in secrets:
        assert secret.encode() not in data, (secret, payloads, values)
    # Not in the pseudonym table either (--report --reveal writes it).
    assert not any(s in o for s in secrets for o in names.originals())
    # Every frame still parses: nothing was withheld for it.
    assert report.withheld == 0
    frames = [r for p in recording_files(out) for r in read_records(p) if r["k"] == "frame"]
    assert len(frames) == len(records) and all(r["raw"] for r in frames)
    # What is no credential is kept or replaced as before: the method name
    # stays, a property that is no credential takes its pseudonym (if asked).
    assert b"token" in data and (b"region" in data)
    assert (b"value-" in data) == bool(values)


def test_no_http_credential_reaches_the_copy(tmp_path: Path) -> None:
    """Headers (Authorization, cookies, any named like a key), query
    parameters of the path, of redirects and of Location and Referer URLs,
    user information in a URL, and credential fields of JSON bodies and
    WebSocket frames: none in the copy."""
    records, secrets = http_records()
    source = capture(tmp_path / "in.sluice", records, PayloadPolicy.FULL)
    out = tmp_path / "out"
    anonymize(source, out, Options(KEY))
    data = copied(out)
    for secret in secrets:
        assert secret.encode() not in data, secret
    http = next(r for p in recording_files(out) for r in read_records(p) if r["k"] == "http")
    headers = dict(http["req"]["h"])
    assert headers["Authorization"] == "<redacted>", headers
    assert "token=<redacted>" in http["path"] and "x=1" in http["path"], http["path"]
