"""``sluice inspect --json``: every record as one JSON object, losing nothing."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from pathlib import Path
from typing import Any

from sluice.commands import main
from sluice.recording import format as fmt

T0 = 10**18


def _inspect_json(path: Path, *extra: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["inspect", str(path), "--json", *extra]) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _capture(path: Path, records: list[dict[str, Any]], protocol: str = "pulsar") -> Path:
    head = fmt.header(capture="abc", segment=1, started_ns=T0, payloads=fmt.PayloadPolicy.HASH,
                      sluice_version="t", protocol=protocol)  # fmt: skip
    path.write_bytes(fmt.dumps([head, *records]))
    return path


def test_a_connection_record_keeps_both_its_kind_and_the_connections(tmp_path: Path) -> None:
    """The record's kind (``conn``) and the connection's (``proxied``,
    ``lookup``) are both said: one key for both lost the record's."""
    conns = [
        {"k": "conn", "c": c, "t": 0, "w": T0, "client": f"127.0.0.1:{c}", "kind": kind,
         "broker": "pulsar://b:6650", "listener": "plain"}
        for c, kind in ((1, "proxied"), (2, "lookup"))
    ]  # fmt: skip
    shown = _inspect_json(_capture(tmp_path / "r.sluice", conns))
    assert [r["kind"] for r in shown] == ["conn", "conn"]
    assert [r["connection_kind"] for r in shown] == ["proxied", "lookup"]


def test_the_digest_of_a_payload_left_out_is_hex_not_a_python_repr(tmp_path: Path) -> None:
    """A frame recorded by its name alone (``NamedFrames``: a protocol
    without a summarizer of its own) keeps its payload's size and digest in
    ``p``: shown as ``payload`` with the digest in hex, as a Pulsar frame's."""
    digest = hashlib.sha256(b"hello").digest()
    frames = [
        {"k": "frame", "c": 1, "d": 0, "t": 0, "w": T0, "n": 5, "raw": b"",
         "s": {"cmd": "PUBLISH"}, "p": p}
        for p in ([5, digest], [5])
    ]  # fmt: skip
    shown = _inspect_json(_capture(tmp_path / "r.sluice", frames, protocol="cursus"))
    assert [r["payload"] for r in shown] == [{"size": 5, "sha256": digest.hex()}, {"size": 5}]
