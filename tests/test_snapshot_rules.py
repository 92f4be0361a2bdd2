"""``--snapshot-on`` rules: what a rule's ``match`` can tell apart depends on
what fires it. A field the event has nothing to compare with is refused at
start in one line, not taken for a rule that never fires (an invalid frame
has no trustworthy command or topic) or ignored into one that fires on every
connection (a broker hanging up)."""

from __future__ import annotations

import pytest

from sluice.protocols.core import Answered, Closed, Invalid
from sluice.proxy.config import PROTOCOL_FAULTS
from sluice.recording.triggers import TriggerError, load_triggers


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        ('{"on": "broker_closed", "match": {"topic": "persistent://public/default/a"}}',
         "rule 1: match.topic cannot be told for 'on': 'broker_closed'"),
        ('{"on": "broker_closed", "match": {"direction": "to_client"}}',
         "rule 1: match.direction cannot be told for 'on': 'broker_closed'"),
        ('{"on": "invalid", "match": {"command": "SEND"}}',
         "rule 1: match.command cannot be told for 'on': 'invalid'"),
        ('[{"on": "invalid"}, {"on": "error", "match": {"direction": "to_client"}}]',
         "rule 2: 'on': 'error' matches the request, which goes to_broker"),
    ],
)  # fmt: skip
def test_a_match_the_event_cannot_be_told_by_is_refused(rule: str, said: str) -> None:
    with pytest.raises(TriggerError) as caught:
        load_triggers(rule, PROTOCOL_FAULTS)
    assert str(caught.value).startswith(said), caught.value
    assert "\n" not in str(caught.value)


def test_the_match_fields_each_kind_has_still_narrow_it() -> None:
    invalid, closed, error = load_triggers(
        '[{"on": "invalid", "match": {"direction": "to_broker", "protocol": "pulsar"}},'
        ' {"on": "broker_closed", "match": {"protocol": "cursus"}},'
        ' {"on": "error", "match": {"command": "SEND", "direction": "to_broker"}}]',
        PROTOCOL_FAULTS,
    )
    assert invalid.fires("pulsar", Invalid(True, "checksum", "bad")) is not None
    assert invalid.fires("pulsar", Invalid(False, "checksum", "bad")) is None
    assert closed.fires("cursus", Closed("broker_closed")) == {"closed": "broker_closed"}
    assert closed.fires("pulsar", Closed("broker_closed")) is None
    failed = Answered("SEND", 0.1, "PersistenceError", "persistent://public/default/a")
    assert error.fires("pulsar", failed) is not None
