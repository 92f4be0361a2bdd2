"""Second look at topic names made complete as Apache Pulsar's TopicName does.

The broker reads a topic's domain with Java's ``String.equalsIgnoreCase``,
which compares each pair of characters upper-cased and then lower-cased with
Java's one-for-one case mappings. The capital I with a dot above (U+0130)
lower-cases to a plain ``i`` there, so ``persİstent://public/default/orders``
is persistent://public/default/orders to the broker. Python's ``str.lower``
writes it as two characters (``i`` and a combining dot), and Sluice took the
name for no topic it knew: a producer so named wrote past every filter.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.filters.config import FilterSpec
from sluice.protocols.filtering import canonical, schema_topic, topic_of
from tests.helpers.support import RawClient, start_proxy
from tests.test_filters import TOPIC, WORDS, _core
from tests.test_filters_producers_known import LOUD, _filtered, _producer, _send, _success
from tests.test_pulsar_core import frame_bytes

DOTTED = "\u0130"  # LATIN CAPITAL LETTER I WITH DOT ABOVE


@pytest.mark.parametrize(
    "name, complete",
    [
        (f"pers{DOTTED}stent://public/default/orders", "persistent://public/default/orders"),
        (f"non-pers{DOTTED}stent://public/default/o", "non-persistent://public/default/o"),
        (f"PERS{DOTTED}STENT://public/default/orders", "persistent://public/default/orders"),
        # Not a letter Java folds to one of the domain's: left as it came.
        ("pers\u00ecstent://public/default/orders", "pers\u00ecstent://public/default/orders"),
    ],
)
def test_the_domain_is_compared_as_java_compares_it(name: str, complete: str) -> None:
    assert canonical(name) == complete
    assert topic_of(name + "-partition-1") == complete


def test_names_are_made_complete_once_not_at_every_send() -> None:
    # The schema filter looks each SEND's schema up by its topic's complete
    # name: worked out afresh, a few microseconds a message (the regex it
    # replaced took a tenth of that).
    name = "persistent://public/default/second-look-memo"
    for made in (canonical, schema_topic, topic_of):
        info = getattr(made, "cache_info", None)
        assert info is not None, f"{made.__name__} is worked out again at every call"
        made(name)
        hits = info().hits
        made(name)
        assert info().hits == hits + 1


def test_a_producer_naming_the_domain_with_a_dotted_capital_i_is_filtered() -> None:
    core, _ = _core(FilterSpec(WORDS, (TOPIC,)))
    core.receive_client(_producer(3, 50, f"pers{DOTTED}stent://public/default/orders"), 1.0)
    core.receive_broker(_success(50), 1.1)
    assert _filtered(core.receive_client(_send(3, LOUD), 1.2), 3)


@pytest.mark.e2e
def test_apache_pulsar_takes_the_dotted_domain_and_sluice_filters_it(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    topic = f"second-look-dotted-{uuid.uuid4().hex[:8]}"
    spec = json.dumps({"topics": [f"persistent://public/default/{topic}"], "direction": "produce"})
    proxy = start_proxy(
        apache_pulsar.url, tmp_path, "--filter", f"tests.helpers.filters:Words:{spec}"
    )
    try:
        with RawClient(proxy.port) as raw:
            # The broker makes the producer: the name is its topic's.
            raw.producer(apache_pulsar.port, f"pers{DOTTED}stent://public/default/{topic}")
            raw.send(_send(1, [b"a bad one"]))  # Words refuses "bad"
            answer = _answer_to_send(raw)
        assert answer == "SEND_ERROR", "the message went past the topic's filter"
    finally:
        proxy.kill()


def _answer_to_send(raw: RawClient, timeout: float = 20.0) -> str:
    """The name of the frame that answers the SEND (skipping pings)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        frame = raw.receive(left)
        assert frame is not None, "connection closed before the SEND was answered"
        if frame.name in ("SEND_RECEIPT", "SEND_ERROR"):
            return frame.name
        if frame.name == "PING":
            raw.send(frame_bytes("PONG"))
    raise TimeoutError("the SEND was not answered in time")
