"""Which topics a web request sends messages to or takes them from.

Message filters run on the binary protocol's SEND and MESSAGE frames. On
Pulsar's web port, messages travel in other shapes, which Sluice does not
unpack: the WebSocket API (``/ws/v2/producer|consumer|reader/...``, the v1
paths with a cluster, the v3 multi-topic consumer), the REST produce
endpoint (``POST /topics/persistent/TENANT/NS/TOPIC``, and its
``partitions/N`` form), and the admin calls that hand out a stored
message (a subscription's ``position/N`` peek, ``examinemessage``, a
message by ``ledger/L/entry/E``). ``message_traffic`` names what such a
request does (the direction, the topics, as the broker completes their
names), so that the HTTP listener can refuse one that a configured filter
covers instead of letting it by unfiltered (``docs/filters.md``, "On the
web port").

Where the broker might read a path two ways (a percent-decoded ``+``,
a segment's ``;parameters``, an empty segment), every reading is named:
the listener refuses when any is filtered; a ``#`` ends the path, as
Jetty reads it. Nothing here imports trio.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from sluice.protocols.filtering import DELIVER, PRODUCE, Direction, canonical

_DOMAINS = ("persistent", "non-persistent")
_WS_KINDS = {"producer": PRODUCE, "consumer": DELIVER, "reader": DELIVER}


@dataclass(frozen=True)
class Traffic:
    """Messages a request sends (``PRODUCE``) or takes (``DELIVER``):
    ``topics`` by their complete names; ``any_topic`` when the request
    names them by a pattern (the v3 consumer's ``topicsPattern``), which
    may take in any topic. ``what`` says which API, for the client's
    answer and the log."""

    direction: Direction
    topics: frozenset[str]
    what: str
    any_topic: bool = False


def message_traffic(method: bytes, target: bytes) -> Traffic | None:
    """What ``target`` (origin form) sends or takes, or None when it is
    no request that carries messages."""
    # What follows a "#" is a fragment to the broker's web server (Jetty),
    # which routes by what comes before it.
    raw_path, _, query = target.partition(b"#")[0].partition(b"?")
    path = raw_path.decode("latin-1")
    readings = _readings(path)
    # The API by any reading's first segment (a leading "//" is one).
    apis = {_plain(parts[1]) for parts in readings if len(parts) > 2}
    if "ws" in apis:
        return _websocket(readings, query.decode("latin-1"))
    if "topics" in apis and method.upper() == b"POST":
        return _merged(
            [_rest_produce(parts) for parts in readings], PRODUCE, "the REST produce API"
        )
    if "admin" in apis:
        return _merged(
            [_admin_read(parts) for parts in readings], DELIVER, "an admin call that reads messages"
        )
    return None


def _readings(path: str) -> list[list[str]]:
    """The path's segments as the broker's WebSocket handler splits them
    (empty ones kept), and without its empty segments (as a web server
    that merges ``//`` routes it)."""
    parts = path.split("/")
    compact = [""] + [p for p in parts[1:] if p]
    return [parts] if compact == parts else [parts, compact]


def _plain(segment: str) -> str:
    """A segment as a servlet is routed by: without its ``;parameters``."""
    return segment.split(";", 1)[0]


def _names(segment: str) -> set[str]:
    """What the broker may make of a topic's encoded name: decoded with
    ``+`` as a space (Java's URLDecoder) and as itself, each with and
    without ``;parameters``."""
    out: set[str] = set()
    for s in {segment, _plain(segment)}:
        out.add(urllib.parse.unquote_plus(s))
        out.add(urllib.parse.unquote(s))
    return out


def _merged(
    found: list[tuple[set[str], str] | None], direction: Direction, what: str
) -> Traffic | None:
    topics: set[str] = set()
    for one in found:
        if one is not None:
            topics |= one[0]
            what = one[1] or what
    return Traffic(direction, frozenset(topics), what) if topics else None


def _websocket(readings: list[list[str]], query: str) -> Traffic | None:
    direction: Direction | None = None
    topics: set[str] = set()
    pattern = False
    what = ""
    for parts in readings:
        plain = [_plain(p) for p in parts]
        if len(plain) < 4 or plain[1] != "ws":
            continue
        if plain[2] == "v3" and plain[3] == "consumer":
            direction, what = DELIVER, "the WebSocket multi-topic consumer"
            found, any_topic = _v3_topics(query)
            topics |= found
            pattern = pattern or any_topic
            continue
        v2 = plain[2] == "v2"
        kind = plain[3] if v2 else plain[2]
        if kind not in _WS_KINDS:
            continue
        direction = _WS_KINDS[kind]
        what = f"the WebSocket {kind}"
        domain_at = 4 if v2 else 3
        if len(parts) < 8 or plain[domain_at] not in _DOMAINS:
            continue
        domain = plain[domain_at]
        namespace = parts[5:7] if v2 else parts[4:7]
        end = len(parts) - 1 if kind == "consumer" else len(parts)
        name = "/".join([parts[7]] + [p for p in parts[8:end] if p])
        for decoded in _names(name):
            ns = "/".join(urllib.parse.unquote(p) for p in namespace)
            topics.add(canonical(f"{domain}://{ns}/{decoded}"))
    if direction is None or not (topics or pattern):
        return None
    return Traffic(direction, frozenset(topics), what, any_topic=pattern)


def _v3_topics(query: str) -> tuple[set[str], bool]:
    """The v3 consumer's topics (``topics=a,b``), and whether it names a
    pattern (``topicsPattern``) instead."""
    topics: set[str] = set()
    pattern = False
    for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if key == "topicsPattern":
            pattern = True
        elif key == "topics":
            topics |= {canonical(t) for t in value.split(",") if t}
    return topics, pattern


def _rest_produce(parts: list[str]) -> tuple[set[str], str] | None:
    """``/topics/DOMAIN/TENANT/NS/TOPIC`` and ``…/TOPIC/partitions/N``."""
    plain = [_plain(p) for p in parts]
    if len(parts) not in (6, 8) or plain[1] != "topics" or plain[2] not in _DOMAINS:
        return None
    if len(parts) == 8 and plain[6] != "partitions":
        return None
    topics = _topics(plain[2], parts[3:5], parts[5])
    if len(parts) == 6:
        return topics, "the REST produce API"
    return {p for t in topics for p in _partitions(t, parts[7])}, "the REST produce API"


_JAVA_INT = range(-(2**31), 2**31)


def _partitions(topic: str, index: str) -> set[str]:
    """What the broker writes ``…/TOPIC/partitions/INDEX`` to: the index
    read as Jersey reads an int (``02`` and ``+2`` are 2), and
    ``TopicName.getPartition``'s rule, under which -1, or a name that has
    ``-partition-`` in it already, is the topic itself; the index as it
    came is named too."""
    found = {f"{topic}-partition-{index}"}
    for text in {_plain(index), urllib.parse.unquote(_plain(index))}:
        try:
            number = int(text)
        except ValueError:
            continue
        if number not in _JAVA_INT:
            continue
        if number == -1 or "-partition-" in topic:
            found.add(topic)
        else:
            found.add(f"{topic}-partition-{number}")
    return found


# Admin calls that answer with a stored message, by what follows the topic.
def _reads_messages(rest: list[str]) -> bool:
    if not rest:
        return False
    if rest[0] == "examinemessage":
        return True
    if rest[0] == "ledger" and len(rest) == 4 and rest[2] == "entry":
        return True
    return rest[0] == "subscription" and len(rest) >= 4 and rest[-2] == "position"


def _admin_read(parts: list[str]) -> tuple[set[str], str] | None:
    """``/admin/v2/DOMAIN/TENANT/NS/TOPIC/…`` and ``/admin/DOMAIN/PROPERTY/
    CLUSTER/NS/TOPIC/…`` (v1), for the calls that hand out messages."""
    plain = [_plain(p) for p in parts]
    if len(plain) < 3 or plain[1] != "admin":
        return None
    if len(plain) > 3 and plain[2] == "v2" and plain[3] in _DOMAINS:
        domain, namespace, at = plain[3], parts[4:6], 6
    elif len(plain) > 2 and plain[2] in _DOMAINS:
        domain, namespace, at = plain[2], parts[3:6], 6
    else:
        return None
    if len(parts) <= at or not _reads_messages(plain[at + 1 :]):
        return None
    return _topics(domain, namespace, parts[at]), "an admin call that reads messages"


def _topics(domain: str, namespace: list[str], topic: str) -> set[str]:
    ns = "/".join(urllib.parse.unquote(p) for p in namespace)
    return {canonical(f"{domain}://{ns}/{name}") for name in _names(topic)}
