"""What a protocol core hands message filters, and what it gets back.

Protocol-neutral and sans-I/O, like ``core.py``: a core that carries
application messages (Pulsar's SEND and MESSAGE) unpacks each one into a
``Message``, asks the ``Filtering`` it was given for the ``Chain`` of its
topic, and carries out the ``Verdict``: the message as it was, changed, or
refused. Batching, compression, checksums and the replies a refused message
gets are the core's business; filters see one plain message at a time.

The filter API users write against is ``sluice.filters`` (which re-exports
these types); this module is what the cores below it may import.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Direction = Literal["produce", "deliver"]
PRODUCE: Direction = "produce"
DELIVER: Direction = "deliver"


@dataclass(frozen=True, slots=True)
class Schema:
    """A topic's schema as its broker keeps it.

    ``type`` is the schema type's wire name (``AVRO``, ``JSON``,
    ``PROTOBUF_NATIVE``, ``KEY_VALUE``, ``STRING``, ``INT32``, ...); ``data``
    its definition (for Avro and JSON an Avro record definition, for
    PROTOBUF_NATIVE a JSON document holding a file descriptor set);
    ``version`` the broker's version of it (opaque bytes)."""

    type: str
    data: bytes
    properties: Mapping[str, str] = field(default_factory=dict)
    version: bytes | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One application message, uncompressed, as a filter sees it.

    Inside a batch each message is its own ``Message`` (``index`` of
    ``count``). ``metadata`` is the protocol's own metadata record, for
    filters that need more than the common facts (read it, do not change
    it: changes go in a ``Replace``)."""

    direction: Direction
    topic: str
    payload: bytes
    properties: Mapping[str, str] = field(default_factory=dict)
    # The routing key as sent (Pulsar's partition key); ``key_is_base64``
    # when the client sent bytes (``key_bytes`` decodes them).
    key: str | None = None
    key_is_base64: bool = False
    event_time: int | None = None  # milliseconds since the epoch, if the producer set it
    # Who: the verified role (proxy authentication; None in passthrough),
    # the client's address, and the producer's name or the subscription.
    role: str | None = None
    client: str = ""
    name: str | None = None
    index: int = 0
    count: int = 1
    # The schema version the producer named (None: a producer without one),
    # and, for filters that want schemas, the schema it names (the topic's
    # latest for a message that names none; None when the topic has none).
    schema_version: bytes | None = None
    schema: Schema | None = None
    # True when the payload is ciphertext the client encrypted (it cannot
    # be read, and is neither decompressed nor split into its batch).
    encrypted: bool = False
    # True when the producer sent no value at all (a tombstone; ``payload`` is empty).
    null: bool = False
    metadata: Any = None

    @property
    def key_bytes(self) -> bytes | None:
        if self.key is None:
            return None
        if self.key_is_base64:
            return base64.b64decode(self.key)
        return self.key.encode()


@dataclass(frozen=True, slots=True)
class Pass:
    """Carry the message on as it is."""


PASS = Pass()


@dataclass(frozen=True, slots=True)
class Replace:
    """Carry the message on with these parts changed (None: unchanged).

    ``properties`` replaces the message's properties whole."""

    payload: bytes | None = None
    properties: Mapping[str, str] | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse the message.

    ``reason`` is short and stable (a metric label: ``schema_mismatch``);
    ``message`` is what the client is told. ``error`` names the protocol's
    error code to answer with (Pulsar: a ``ServerError`` name such as
    ``NotAllowedError``); None picks the code the client fails just that
    message on (see docs/filters.md)."""

    reason: str
    message: str = ""
    error: str | None = None


Verdict = Pass | Replace | Reject


@dataclass(frozen=True, slots=True)
class Outcome:
    """A chain's answer for one message: the verdict, the filter that
    refused it (or changed it last), the filters that raised, and those
    that changed it, in order. A ``Replace`` here holds the parts as the
    last filter left them, and None for each part no filter set: the core
    keeps those as the client sent them."""

    verdict: Verdict
    filter: str | None = None
    errors: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """An entry's data key wrapped with one public key: the key's name, the
    wrapped bytes, and the metadata its owner gave the key."""

    name: str
    value: bytes
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sealed:
    """A whole entry encrypted end to end: the ciphertext, and what a
    consumer holding one of the private keys needs to decrypt it."""

    data: bytes
    keys: tuple[WrappedKey, ...]
    param: bytes  # the cipher's parameter (Pulsar: the IV)


class Sealer(Protocol):
    """End-to-end encryption of whole entries, as the protocol's clients do
    it (a filter's ``sealer``): entries are encrypted after every message
    filter (produce) and decrypted before them (deliver)."""

    # Bytes an entry grows by when sealed (Pulsar: the GCM tag).
    overhead: int
    # A delivery it cannot decrypt: "pass" (on as it came) or "skip" (refused).
    undecryptable: str

    def seal(self, topic: str, data: bytes) -> Sealed: ...

    def lease(self) -> tuple[bytes, tuple[WrappedKey, ...], float]:
        """For a core that seals on a compiled path: the data key itself,
        its wrapped keys, and for how many seconds from now they may be
        used (then ask again: keys rotate, key files change)."""
        ...

    def open(
        self, topic: str, keys: Sequence[WrappedKey], param: bytes, data: bytes
    ) -> bytes | None:
        """The plaintext, or None when no key held here opens it."""
        ...


class Chain(Protocol):
    """The filters one topic's messages in one direction go through, in order."""

    @property
    def wants_schema(self) -> bool: ...

    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def hooked(self) -> bool:
        """Whether any filter of the chain looks at single messages."""
        ...

    @property
    def sealer(self) -> tuple[str, Sealer] | None:
        """The filter that encrypts (produce) or decrypts (deliver) whole
        entries, by name, if one applies."""
        ...

    def run(self, message: Message) -> Outcome: ...


class Filtering(Protocol):
    """Every configured filter of a proxy process, and the schemas they
    were given (shared by all its connections)."""

    def chain(self, topic: str, direction: Direction, role: str | None) -> Chain | None:
        """The filters for ``topic`` in ``direction`` for ``role``, or None
        when no filter wants them (its messages are then not unpacked)."""
        ...

    def schema(self, topic: str, version: bytes | None, now: float) -> Schema | Unknown | None:
        """The schema ``version`` of ``topic`` (None: the latest) if known:
        None when the topic has none, ``UNKNOWN`` when it must be asked for."""
        ...

    def learn_schema(
        self, topic: str, version: bytes | None, schema: Schema | None, now: float
    ) -> None: ...

    def forget_schemas(self, topic: str, now: float) -> None:
        """A producer opens on ``topic`` at ``now``: it may register a new
        version, or the topic may have been deleted and made again, its
        version numbers now standing for other schemas. Every schema of it
        learned over a second ago is asked again."""
        ...


class Unknown:
    """``Filtering.schema``'s answer when the schema must be asked for."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = Unknown()


# A partition's number, as Java's Integer.parseInt reads it (a sign allowed).
_PARTITION = re.compile(r"-partition-\+?\d+")
_DOMAINS = ("persistent", "non-persistent")
# Names made complete, remembered: the schema filter looks a SEND's schema up
# by its topic's complete name, once per message (a few microseconds each,
# worked out afresh). Bounded: a client may name any number of topics.
_NAMES_KEPT = 4096


@functools.lru_cache(maxsize=_NAMES_KEPT)
def topic_of(name: str) -> str:
    """The topic a partition's name belongs to (``orders-partition-2``:
    ``orders``), in the spelling the broker gives it (``canonical``). A
    partition's schema, filters and frames are its topic's."""
    name = canonical(name)
    cut = name.rfind("-partition-")
    if cut >= 0 and _PARTITION.fullmatch(name, cut):
        return name[:cut]
    return name


# Apache Pulsar's largest partition index (a Java int).
_MAX_PARTITION = 2**31 - 1


@functools.lru_cache(maxsize=_NAMES_KEPT)
def schema_topic(name: str) -> str:
    """The topic whose schema ``name``'s messages are read with: its
    partitioned topic where the broker takes ``name`` for a partition, else
    ``name`` itself (``canonical``). Narrower than ``topic_of``, which
    filters match by: Apache Pulsar's ``TopicName.getPartitionIndex`` takes
    a partition's index only as Java writes the number (no sign, no leading
    zero, an int), and reads ``orders-partition-01`` as a topic of its own,
    with a schema of its own, which any client may make where topics are
    made on first use. Were it kept as ``orders``'s, a client could have
    Sluice check ``orders``'s messages against it. (Older brokers, which
    took such names for partitions, answer Sluice's question about one with
    its topic's schema: kept under its own name, that is right too.)"""
    name = canonical(name)
    cut = name.rfind("-partition-")
    if cut < 0:
        return name
    index = name[cut + len("-partition-") :]
    # Java's Integer.parseInt reads any Unicode decimal digit, as Python's int does.
    if not index.isdecimal() or not 0 <= (number := int(index)) <= _MAX_PARTITION:
        return name
    if len(str(number)) != len(index):  # a leading zero: Java's check of its length
        return name
    return name[:cut]


@functools.lru_cache(maxsize=_NAMES_KEPT)
def canonical(name: str) -> str:
    """A topic's name as Apache Pulsar's ``TopicName`` makes it complete, so
    that every spelling a broker takes for one topic is that topic to the
    filters: a short name (``orders``: ``persistent://public/default/orders``;
    ``acme/shop/orders``: ``persistent://acme/shop/orders``; empty parts of
    a short name are dropped, as Java's ``StringUtils.split`` drops them),
    and the domain in any case (``Persistent://``). A name the broker
    refuses is returned as it came (no producer or consumer is made on it)."""
    if "://" not in name:
        parts = [part for part in name.split("/") if part]
        if len(parts) == 3:
            name = "persistent://" + name
        elif len(parts) == 1:
            name = "persistent://public/default/" + parts[0]
        else:
            return name
    domain, _, rest = name.partition("://")
    for known in _DOMAINS:
        if _same_ignoring_case(domain, known):
            domain = known
            break
    else:
        return name
    if len(rest.split("/", 3)) < 3:  # new: tenant/namespace/topic; legacy: one more part
        return name
    return f"{domain}://{rest}"


def _same_ignoring_case(a: str, b: str) -> bool:
    """Java's ``String.equalsIgnoreCase``: character by character, each
    compared upper-cased and lower-cased (so the long s, U+017F, is ``s``,
    the dotless i, U+0131, is ``i``, and so is the dotted capital I, U+0130)."""
    return len(a) == len(b) and all(
        x == y or _upper(x) == _upper(y) or _lower(_upper(x)) == _lower(_upper(y))
        for x, y in zip(a, b, strict=True)
    )


def _upper(c: str) -> str:
    """Java's ``Character.toUpperCase``: one character for one."""
    upper = c.upper()
    return upper if len(upper) == 1 else c


def _lower(c: str) -> str:
    """Java's ``Character.toLowerCase``: one character for one. Python's
    ``str.lower`` writes the dotted capital I (U+0130) as two characters
    (``i`` and a combining dot: the one such character in Unicode); Java's
    one-for-one mapping makes it ``i``."""
    if c == "\u0130":
        return "i"
    lower = c.lower()
    return lower if len(lower) == 1 else c
