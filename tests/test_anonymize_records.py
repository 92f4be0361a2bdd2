"""``sluice record anonymize`` on records and captures built here, without
a broker or a proxy: what a capture names outside its frames (directory
and file names, web API paths) and what it cannot parse."""

from __future__ import annotations

import time
from pathlib import Path

from sluice.protocols.pulsar import encode_payload, pb
from sluice.recording import format as fmt
from sluice.recording.anonymize import Anonymizer, Options, anonymize
from sluice.recording.format import PayloadPolicy, read_records, recording_files

KEY = b"k" * 32


def capture_file(
    path: Path, *records: fmt.Record, payloads: PayloadPolicy = PayloadPolicy.HASH
) -> Path:
    """A recording of ``records`` after a header, at ``path``."""
    head = fmt.header(capture="0123456789ab", segment=1, started_ns=1,
                      payloads=payloads, sluice_version="0")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(fmt.dumps([head, *records]))
    return path


def test_directory_and_file_names_carry_no_reason_or_name(tmp_path: Path) -> None:
    """A snapshot's directory names its reason (``snapshot-<time>-<reason>-<id>``),
    and a capture may sit in directories (or a file) named by its owner: the
    copy's paths keep none of them (the snapshot directory kept its slug, a
    customer's name, and every other name as it was)."""
    source = tmp_path / "in"
    topic = "persistent://initech/payroll/salaries"
    snapshot = {"k": "snapshot", "t": 1, "w": 1, "reason": "initech payroll", "seconds": 3,
                "topic": topic}  # fmt: skip
    stamp = "sluice-20260101T000000-0123456789ab-0001.sluice"
    capture_file(source / "snapshot-20260101T000000-initech-payroll-3fa2c1" / stamp, snapshot)
    capture_file(source / "initech-prod" / "globex-incident.sluice", snapshot)
    anonymize(source, tmp_path / "out", Options(KEY))
    written = sorted(
        str(p.relative_to(tmp_path / "out")) for p in recording_files(tmp_path / "out")
    )
    assert len(written) == 2, written
    for name in ("initech", "payroll", "globex", "incident", "prod"):
        assert not any(name in p for p in written), (name, written)
    # A snapshot's directory is still one, its time and id kept; Sluice's
    # own file names (a time and a capture id) stay as they were.
    assert any(p.startswith("snapshot-20260101T000000-3fa2c1/") and p.endswith(stamp)
               for p in written), written  # fmt: skip
    for path in recording_files(tmp_path / "out"):
        kinds = [r["k"] for r in read_records(path)]
        assert kinds == ["header", "snapshot"], kinds


def web_path(anonymizer: Anonymizer, path: str) -> str:
    """An HTTP exchange's path, as the copy has it."""
    return str(anonymizer.record({
        "k": "http", "h": 1, "x": 1, "client": "10.9.8.7:5000", "t": 0, "w": 0,
        "method": "GET", "path": path, "kind": "admin", "status": 200,
        "req": {"h": [], "n": 0}, "res": {"h": [], "n": 0},
    })["path"])  # fmt: skip


def test_web_paths_lose_roles_clusters_brokers_functions_and_subscriptions() -> None:
    """Admin API paths name more than tenants, namespaces and topics: a role
    granted permissions, a cluster, a broker's address, a function (source,
    sink, package), a subscription a namespace is cleared of; and the v1 API
    names a topic in four parts. Each was kept unless a frame had named it
    (a frame rarely does: the names were in the copy)."""
    paths = {
        "/admin/v2/namespaces/initech/labs/permissions/alice-admin": ["alice-admin"],
        "/admin/v2/persistent/initech/labs/orders/permissions/bob-reader": ["bob-reader"],
        "/admin/v2/clusters/uswest-prod": ["uswest-prod"],
        "/admin/v2/clusters/uswest-prod/failureDomains/rack-seven": ["uswest-prod", "rack-seven"],
        "/admin/v2/brokers/uswest-prod": ["uswest-prod"],
        "/admin/v2/brokers/uswest-prod/broker-3.initech.corp:8080/ownedNamespaces":
            ["uswest-prod", "broker-3", "initech.corp"],
        "/admin/v3/functions/initech/labs/payroll-fn/status": ["initech", "labs", "payroll-fn"],
        "/admin/v3/sinks/initech/labs/ledger-sink": ["initech", "labs", "ledger-sink"],
        "/admin/v3/sources/initech/labs/hr-source": ["initech", "labs", "hr-source"],
        "/admin/v3/packages/function/initech/labs/payroll-pkg/v1": ["initech", "payroll-pkg"],
        "/admin/v2/namespaces/initech/labs/unsubscribe/audit-sub": ["audit-sub"],
        "/admin/v2/namespaces/initech/labs/0x0_0x8/clearBacklog/audit-sub": ["audit-sub"],
        "/admin/v2/bookies/racks-info/bookie-1.initech.corp:3181": ["bookie-1", "initech.corp"],
        "/admin/persistent/initech/uswest-prod/labs/orders/stats":
            ["initech", "uswest-prod", "labs", "orders"],
        "/admin/namespaces/initech/uswest-prod/labs": ["initech", "uswest-prod", "labs"],
        "/ws/consumer/persistent/initech/uswest-prod/labs/orders/audit-sub":
            ["initech", "uswest-prod", "labs", "orders", "audit-sub"],
        "/lookup/v2/destination/persistent/initech/uswest-prod/labs/orders":
            ["initech", "uswest-prod", "labs", "orders"],
    }  # fmt: skip
    for path, originals in paths.items():
        anonymizer = Anonymizer(Options(KEY, "hash"), "pulsar")  # nothing learnt elsewhere
        done = web_path(anonymizer, path)
        assert [o for o in originals if o in done] == [], (path, done)
    # The words of the API itself stay, and a v1 path names a topic as its
    # frames do (tenant, cluster, namespace, topic).
    anonymizer = Anonymizer(Options(KEY, "hash"), "pulsar")
    assert web_path(anonymizer, "/admin/v3/functions/builtins") == "/admin/v3/functions/builtins"
    assert web_path(anonymizer, "/admin/v2/brokers/health") == "/admin/v2/brokers/health"
    topic = anonymizer.names.topic("persistent://initech/uswest-prod/labs/orders")
    done = web_path(anonymizer, "/admin/persistent/initech/uswest-prod/labs/orders/stats")
    assert done == "/admin/" + topic.replace("://", "/") + "/stats", (done, topic)
    namespace = anonymizer.names.namespace("initech/uswest-prod/labs")
    assert namespace == "/".join(topic.split("://")[1].split("/")[:3]), (namespace, topic)


def test_a_filters_sent_frame_that_does_not_parse_is_said_to_be_withheld() -> None:
    """A filter's changed frame (``sent``) whose bytes do not parse lost
    them without a word: no ``withheld`` on it, not counted in the report,
    unlike a frame record's."""
    anonymizer = Anonymizer(Options(KEY), "pulsar")
    junk = b"\x00\x00\x00\x09\x00\x00\x00\x05junk!"
    done = anonymizer.record({"k": "filter", "c": 1, "t": 0, "w": 0, "filter": "mask",
                              "action": "replaced", "d": 0, "n": 1,
                              "sent": {"n": len(junk), "raw": junk}})  # fmt: skip
    assert done["sent"]["raw"] == b""
    assert "did not parse" in done["sent"].get("withheld", ""), done
    assert anonymizer.report.withheld == 1
    frame = anonymizer.record({"k": "frame", "c": 1, "d": 0, "t": 0, "w": 0, "n": len(junk),
                               "raw": junk, "s": {"cmd": "UNKNOWN(5)"}})  # fmt: skip
    assert frame["raw"] == b"" and frame["s"]["withheld"] == done["sent"]["withheld"]
    assert anonymizer.report.withheld == 2


def send(sequence: int, properties: dict[str, str]) -> bytes:
    """A SEND frame of producer 1 with ``properties``."""
    cmd = pb.BaseCommand(type=pb.BaseCommand.SEND)
    cmd.send.producer_id, cmd.send.sequence_id = 1, sequence
    meta = pb.MessageMetadata(producer_name="initech-producer", sequence_id=sequence,
                              publish_time=1)  # fmt: skip
    meta.properties.extend(pb.KeyValue(key=k, value=v) for k, v in properties.items())
    return encode_payload(cmd, meta, b"payload")


def test_many_names_and_connections_take_time_in_proportion(tmp_path: Path) -> None:
    """Every new original made the free-text pattern be built again at the
    next scrub, and reading the capture to learn the originals scrubbed each
    connection's and close's text: a capture of a few thousand connections,
    each with a message of its own property value (an order id), took
    minutes, growing with the square of its size."""
    records: list[fmt.Record] = []
    for c in range(3000):
        raw = send(c, {"order": f"order-{c:08d}"})
        records += [
            {"k": "conn", "c": c, "t": c, "w": c, "client": "192.0.2.7:4000",
             "broker": "pulsar://broker.initech.corp:6650", "kind": "proxied",
             "listener": "plain"},
            {"k": "frame", "c": c, "d": 0, "t": c, "w": c, "n": len(raw), "raw": raw},
            {"k": "close", "c": c, "t": c, "w": c, "reason": "closed"},
        ]  # fmt: skip
    source = capture_file(tmp_path / "in.sluice", *records, payloads=PayloadPolicy.FULL)
    started = time.monotonic()
    report, names = anonymize(source, tmp_path / "out", Options(KEY))
    took = time.monotonic() - started
    assert report.frames == 3000 and len(names.table["value"]) == 3000
    assert took < 20, f"{took:.1f} s"
    data = b"".join(p.read_bytes() for p in recording_files(tmp_path / "out"))
    assert b"order-00002999" not in data and b"initech" not in data


def test_headers_that_name_intermediaries_lose_their_hosts() -> None:
    """A proxy between the client and Sluice names itself in ``Via`` and
    ``X-Forwarded-Server`` (and the host asked for in ``X-Original-Host``,
    ``X-Host``): these were scrubbed as free text only, so a host no other
    record named stayed as it was."""
    anonymizer = Anonymizer(Options(KEY, "hash"), "pulsar")
    headers = [["via", "1.1 squid.initech.corp:3128 (squid/5.7), 1.0 gw-2.initech.corp"],
               ["x-forwarded-server", "edge-1.initech.corp"],
               ["x-original-host", "pulsar-admin.initech.corp"],
               ["x-host", "pulsar.initech.corp:8443"]]  # fmt: skip
    done = anonymizer.record({
        "k": "http", "h": 1, "x": 1, "client": "10.9.8.7:5000", "t": 0, "w": 0,
        "method": "GET", "path": "/admin/v2/clusters", "kind": "admin", "status": 200,
        "req": {"h": headers, "n": 0}, "res": {"h": [], "n": 0},
    })  # fmt: skip
    values = dict(done["req"]["h"])
    assert not any("initech" in v for v in values.values()), values
    # Via keeps its protocols, ports and comments; every host is a pseudonym.
    hosts = [anonymizer.names.host(h) for h in ("squid.initech.corp", "gw-2.initech.corp")]
    assert values["via"] == f"1.1 {hosts[0]}:3128 (squid/5.7), 1.0 {hosts[1]}", values
    assert values["x-host"] == anonymizer.names.address("pulsar.initech.corp:8443")


def test_an_absolute_location_or_referer_path_is_read_as_a_web_path() -> None:
    """A relative ``Location`` went through the web path's names, an
    absolute one (or a ``Referer``, an ``Origin``) only had its path
    scrubbed: a cluster, role or percent-encoded topic it named stayed."""
    anonymizer = Anonymizer(Options(KEY, "hash"), "pulsar")
    headers = [
        ["referer", "https://console.initech.corp/admin/v2/clusters/uswest-prod?q=1"],
        ["location", "http://[2001:db8::5]:8080/admin/v2/persistent/t/n/my%20orders"],
    ]
    done = anonymizer.record({
        "k": "http", "h": 1, "x": 1, "client": "10.9.8.7:5000", "t": 0, "w": 0,
        "method": "GET", "path": "/", "kind": "admin", "status": 200,
        "req": {"h": headers, "n": 0}, "res": {"h": [], "n": 0},
    })  # fmt: skip
    values = dict(done["req"]["h"])
    names = anonymizer.names
    cluster = names.name("cluster", "uswest-prod")
    host = names.host("console.initech.corp")
    assert values["referer"] == f"https://{host}/admin/v2/clusters/{cluster}", values
    topic = names.topic("persistent://t/n/my orders").replace("://", "/")
    assert values["location"] == f"http://{names.address('[2001:db8::5]:8080')}/admin/v2/{topic}"


def test_ip_addresses_in_free_text_are_replaced_wherever_they_are(tmp_path: Path) -> None:
    """An IPv4 address in text no field says the kind of (a header Sluice
    does not know, Envoy's X-Envoy-External-Address; an error message; a
    reason) was kept unless a field had named it: it now takes the
    pseudonym the address has everywhere."""
    http = {
        "k": "http", "h": 1, "x": 1, "client": "192.0.2.7:5000", "t": 0, "w": 0, "te": 0,
        "method": "GET", "path": "/admin/v2/clusters", "kind": "admin", "status": 200,
        "req": {"h": [["x-envoy-external-address", "203.0.113.45"],
                      ["x-note", "from 192.0.2.7 via 198.51.100.9:8080; v1.2.3"]], "n": 0},
        "res": {"h": [], "n": 0},
    }  # fmt: skip
    snapshot = {"k": "snapshot", "t": 1, "w": 1, "seconds": 3,
                "reason": "broker 198.51.100.9 stalled"}  # fmt: skip
    source = capture_file(tmp_path / "in.sluice", http, snapshot)
    _, names = anonymize(source, tmp_path / "out", Options(KEY))
    data = b"".join(p.read_bytes() for p in recording_files(tmp_path / "out"))
    for original in (b"203.0.113.45", b"192.0.2.7", b"198.51.100.9"):
        assert original not in data, original
    records = [r for p in recording_files(tmp_path / "out") for r in read_records(p)]
    headers = dict(records[1]["req"]["h"])
    client = records[1]["client"].split(":")[0]
    assert headers["x-note"] == f"from {client} via {names.host('198.51.100.9')}:8080; v1.2.3"
    assert headers["x-envoy-external-address"] == names.host("203.0.113.45")
    # A snapshot's reason is replaced whole (tests/test_anonymize_gaps_reason.py).
    assert records[2]["reason"] == names.name("name", "broker 198.51.100.9 stalled")


def test_the_report_names_a_truncated_file_by_its_copy(tmp_path: Path) -> None:
    """The report (shareable: it holds no originals) named a file cut short
    by its original name, which the copy had replaced."""
    snapshot = {"k": "snapshot", "t": 1, "w": 1, "seconds": 3, "reason": "x"}
    path = capture_file(tmp_path / "in" / "initech-payroll.sluice", snapshot, snapshot)
    path.write_bytes(path.read_bytes()[:-3])  # its last record cut short
    report, _ = anonymize(tmp_path / "in", tmp_path / "out", Options(KEY))
    assert len(report.truncated) == 1, report.truncated
    (copy,) = recording_files(tmp_path / "out")
    assert "initech" not in report.truncated[0] and copy.name in report.truncated[0], report
