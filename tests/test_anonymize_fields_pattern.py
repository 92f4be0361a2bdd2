"""``sluice record anonymize`` on a topics pattern (GET_TOPICS_OF_NAMESPACE
and WATCH_TOPIC_LIST, a pattern consumer's), built here as a client sends
it, without a broker."""

from __future__ import annotations

import re

from sluice.protocols.pseudonyms import Pseudonyms
from sluice.protocols.pulsar import encode, pb
from sluice.protocols.pulsar.anonymize import anonymized_frame
from sluice.protocols.pulsar.decoder import decode_frame

KEY = b"k" * 32
NAMESPACE = "acme/billing"
PATTERN = "persistent://acme/billing/payroll-.*"


def get_topics(pattern: str) -> bytes:
    cmd = pb.BaseCommand(type=pb.BaseCommand.GET_TOPICS_OF_NAMESPACE)
    ask = cmd.getTopicsOfNamespace
    ask.request_id, ask.namespace, ask.topics_pattern = 1, NAMESPACE, pattern
    ask.mode = pb.CommandGetTopicsOfNamespace.PERSISTENT
    return encode(cmd)


def watch(pattern: str) -> bytes:
    cmd = pb.BaseCommand(type=pb.BaseCommand.WATCH_TOPIC_LIST)
    ask = cmd.watchTopicList
    ask.request_id, ask.watcher_id, ask.namespace, ask.topics_pattern = 2, 1, NAMESPACE, pattern
    return encode(cmd)


def copied(raw: bytes, names: Pseudonyms) -> pb.BaseCommand:
    """``raw``'s anonymized copy, the table learned first (as ``record
    anonymize`` reads a capture twice)."""
    names.learning = True
    anonymized_frame(raw, names)
    names.learning = False
    done = anonymized_frame(raw, names)
    assert done is not None
    command = decode_frame(done[0]).command
    assert command is not None
    return command


def test_a_topics_pattern_keeps_no_part_of_a_topic_name() -> None:
    """A topics pattern was scrubbed as free text: ``payroll-.*`` is no
    name the table holds, so ``payroll-`` stayed. Its tenant and namespace
    take the pseudonyms the command's namespace takes, its regex one of its
    own (a regex too)."""
    names = Pseudonyms(KEY)
    names.topic("persistent://acme/billing/payroll-2024")  # a topic seen elsewhere
    ask = copied(get_topics(PATTERN), names).getTopicsOfNamespace
    watched = copied(watch(PATTERN), names).watchTopicList
    for namespace, pattern in ((ask.namespace, ask.topics_pattern),
                               (watched.namespace, watched.topics_pattern)):  # fmt: skip
        assert "payroll" not in pattern and "acme" not in pattern and "billing" not in pattern
        re.compile(pattern)
        domain, _, rest = pattern.partition("://")
        assert domain == "persistent"
        assert rest.rpartition("/")[0] == namespace == names.namespace(NAMESPACE)
        assert rest.rpartition("/")[2] not in ("", "payroll-.*")
    assert ask.topics_pattern == watched.topics_pattern  # one original, one pseudonym
    # Another regex, another pseudonym.
    other = copied(get_topics("persistent://acme/billing/audit-.*"), names)
    assert other.getTopicsOfNamespace.topics_pattern != ask.topics_pattern


def test_a_pattern_of_every_topic_of_a_namespace_stays_one() -> None:
    """A regex that holds no letter or digit (``.*``) names nothing and is
    kept, so that the copy's pattern consumer still asks for every topic of
    its namespace."""
    names = Pseudonyms(KEY)
    pattern = copied(get_topics("persistent://acme/billing/.*"), names)
    assert pattern.getTopicsOfNamespace.topics_pattern == (
        f"persistent://{names.namespace(NAMESPACE)}/.*"
    )
