"""Broker addresses inside replies: finding them and pointing them elsewhere.

Cursus clients route by what replies name, so a proxy that wants to keep
them must rewrite every address a client would dial:

- ``leaders=h:p,h:p,…`` in an ``OK`` reply (METADATA): one per partition;
- ``host=`` and ``port=`` in an ``OK`` reply (FIND_COORDINATOR) and in
  ``ERROR: NOT_COORDINATOR host=… port=…``;
- the word after ``LEADER_IS`` in any text reply that holds
  ``NOT_LEADER LEADER_IS`` (CONSUME, batches, and the middle of a STREAM),
  and the address after that marker inside a JSON answer's strings (the
  event store's client takes it from the ``error`` of a JSON answer).

Words are found the way the client finds them (split on whitespace, last
``host=``/``port=`` wins), and only the address bytes change: everything
else in the reply stays as the broker wrote it. The JSON ack's ``"leader"``
is a Raft address the client never dials; it is left alone. Batches and
keepalives hold no addresses, and neither does a snapshot (``OK
snapshot=<json>``, READ_SNAPSHOT's answer): its words are the application's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sluice.protocols.cursus.batch import is_batch
from sluice.protocols.cursus.text import decode_text, encode_text

AddressMap = Callable[[str, int], tuple[str, int]]
"""Upstream (host, port) → the (host, port) clients should dial instead."""

_WORD = re.compile(r"\S+")
_NOT_LEADER = "NOT_LEADER LEADER_IS"
_SNAPSHOT = "snapshot="


def parse_address(text: str) -> tuple[str, int] | None:
    """``"h:9000"`` → ``("h", 9000)``; ``"[::1]:9000"`` → ``("::1", 9000)``;
    ``None`` when it is no address."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or len(port) > 5:
        return None
    number = int(port)
    if number > 65535:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, number


def format_address(host: str, port: int) -> str:
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class _Edit:
    start: int  # of the value to replace, in the text
    end: int
    kind: str  # "address" (host:port), "host", "port"


# In a JSON answer: the address after the marker, up to what ends it in
# JSON text (no address holds a quote, a backslash, a comma or a brace).
_JSON_LEADER = re.compile(r"NOT_LEADER LEADER_IS\s+([^\s\"\\,}\]]+)")


def _json_edits(text: str) -> list[_Edit]:
    """Where ``NOT_LEADER LEADER_IS <addr>`` names a broker inside a JSON
    answer's strings (the event store's client dials what follows the
    marker in its ``error``); nothing else in JSON is routed by."""
    out: list[_Edit] = []
    for found in _JSON_LEADER.finditer(text):
        if parse_address(found.group(1)) is not None:
            out.append(_Edit(found.start(1), found.end(1), "address"))
    return out


def _edits(text: str) -> list[_Edit]:
    """Where the addresses of a text (or JSON) reply are."""
    if text.startswith("{"):
        return _json_edits(text) if _NOT_LEADER in text else []
    if "leaders=" not in text and "host=" not in text and _NOT_LEADER not in text:
        return []  # (most replies: what every rule below looks for first is absent)
    words = [(m.start(), m.end(), m.group()) for m in _WORD.finditer(text)]
    if not words:
        return []
    first = words[0][2]
    out: list[_Edit] = []
    is_ok = first == "OK"
    if is_ok:
        # READ_SNAPSHOT's answer: what follows ``snapshot=`` is the
        # application's snapshot (JSON, spaces and all), which the client
        # takes whole. Words in it are data, not brokers.
        for i, (start, _, word) in enumerate(words):
            if word.startswith(_SNAPSHOT):
                words = words[:i]
                text = text[:start]
                break
    if is_ok:
        for start, _, word in words:
            if word.startswith("leaders="):
                pos = start + len("leaders=")
                for entry in word[len("leaders=") :].split(","):
                    stripped = entry.strip()
                    if parse_address(stripped) is not None:
                        lead = entry.find(stripped)
                        out.append(_Edit(pos + lead, pos + lead + len(stripped), "address"))
                    pos += len(entry) + 1
    if is_ok or (first.startswith("ERROR") and "NOT_COORDINATOR" in text):
        hosts = [(s, e) for s, e, w in words if w.startswith("host=")]
        ports = [(s, e) for s, e, w in words if w.startswith("port=")]
        if hosts and ports:
            out += [_Edit(s + len("host="), e, "host") for s, e in hosts]
            out += [_Edit(s + len("port="), e, "port") for s, e in ports]
    if _NOT_LEADER in text:
        for i, (_, _, word) in enumerate(words[:-1]):
            if word == "LEADER_IS":
                start, end, addr = words[i + 1]
                if parse_address(addr) is not None:
                    out.append(_Edit(start, end, "address"))
    edits: list[_Edit] = []
    for edit in sorted(set(out), key=lambda e: (e.start, -e.end)):
        if not edits or edit.start >= edits[-1].end:  # contrived overlaps: the first wins
            edits.append(edit)
    return edits


def _text_reply(body: bytes) -> str | None:
    if not body or is_batch(body):
        return None
    return decode_text(body)


def addresses_in(body: bytes) -> list[tuple[str, int]]:
    """Every broker address a client would take from this reply body, in order."""
    text = _text_reply(body)
    if text is None:
        return []
    edits = _edits(text)
    out: list[tuple[str, int]] = []
    coordinator = _coordinator(text, edits)
    for edit in edits:
        if edit.kind == "address":
            found = parse_address(text[edit.start : edit.end])
            if found is not None:
                out.append(found)
        elif edit.kind == "port" and coordinator is not None and coordinator not in out:
            out.append(coordinator)
    return out


def _coordinator(text: str, edits: list[_Edit]) -> tuple[str, int] | None:
    """The (host, port) the client reads: the last ``host=`` and the last ``port=``."""
    hosts = [e for e in edits if e.kind == "host"]
    ports = [e for e in edits if e.kind == "port"]
    if not hosts or not ports:
        return None
    host = text[hosts[-1].start : hosts[-1].end]
    port = text[ports[-1].start : ports[-1].end]
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address as URLs write it
        host = host[1:-1]
    if not port.isascii() or not port.isdigit() or int(port) > 65535 or not host:
        return None
    return host, int(port)


def rewrite_addresses(body: bytes, mapping: AddressMap) -> bytes | None:
    """``body`` with every address it names replaced by ``mapping``'s answer;
    ``None`` when it names none (forward the original bytes)."""
    text = _text_reply(body)
    if text is None:
        return None
    edits = _edits(text)
    if not edits:
        return None
    coordinator = _coordinator(text, edits)
    new_coordinator = mapping(*coordinator) if coordinator is not None else None
    parts: list[str] = []
    pos = 0
    changed = False
    for edit in edits:
        old = text[edit.start : edit.end]
        if edit.kind == "address":
            found = parse_address(old)
            assert found is not None
            new = format_address(*mapping(*found))
        elif new_coordinator is None:
            continue
        elif edit.kind == "host":
            new = new_coordinator[0]
            if old.startswith("[") and ":" in new:  # written as the broker wrote it
                new = f"[{new}]"
        else:
            new = str(new_coordinator[1])
        parts.append(text[pos : edit.start])
        parts.append(new)
        pos = edit.end
        changed = True
    if not changed:
        return None
    parts.append(text[pos:])
    return encode_text("".join(parts))
