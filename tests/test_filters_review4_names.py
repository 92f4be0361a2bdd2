"""A PRODUCER or SUBSCRIBE whose topic is not UTF-8.

Java's clients and brokers read such a name with replacement characters
(and the broker makes that topic); Python's protobuf hands it over as
bytes. The filter gate passed those bytes to the filters' name matching,
which raised: the connection ended on a bug of Sluice's, its traceback
logged, at every such PRODUCER, whatever the topic.
"""

from __future__ import annotations

from pathlib import Path

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Peer
from tests.test_encryption import key_pair
from tests.test_filters import WORDS, _core
from tests.test_filters_producers_known import LOUD, _filtered, _producer, _send, _success
from tests.test_pulsar_core import names, sent

NOT_UTF8 = b"persistent://public/default/orders\xff"


def _raw_producer(producer_id: int, request_id: int) -> bytes:
    """A PRODUCER whose topic is not UTF-8: the broker reads it with a
    replacement character, and makes that topic."""
    raw = _producer(producer_id, request_id, "persistent://public/default/ordersX")
    return raw.replace(b"ordersX", NOT_UTF8[-7:])


def test_a_producer_on_a_name_that_is_not_utf8_is_filtered_not_a_crash() -> None:
    core, _ = _core(FilterSpec(WORDS, ("persistent://public/default/*",)))
    out = core.receive_client(_raw_producer(3, 50), 1.0)
    assert names(out, Peer.BROKER) == ["PRODUCER"]
    core.receive_broker(_success(50), 1.1)
    assert _filtered(core.receive_client(_send(3, LOUD), 1.2), 3)


def test_a_producer_on_a_name_that_is_not_utf8_is_marked_encrypting(tmp_path: Path) -> None:
    public, _, _ = key_pair(tmp_path, "k")
    spec = FilterSpec("encrypt", ("persistent://public/default/*",), "produce",
                      settings={"public_keys": {"k": str(public)}})  # fmt: skip
    core, _ = _core(spec)
    out = core.receive_client(_raw_producer(3, 50), 1.0)
    (producer,) = sent(out, Peer.BROKER)
    assert producer.body.encrypted
    core.receive_broker(_success(50), 1.1)
    (frame,) = sent(core.receive_client(_send(3, LOUD), 1.2), Peer.BROKER)
    assert frame.metadata is not None and [k.key for k in frame.metadata.encryption_keys] == ["k"]
