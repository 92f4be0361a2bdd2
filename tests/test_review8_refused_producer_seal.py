"""Review 8 (encrypt, the compiled sealing path): a PRODUCER the broker
refuses leaves its id sealed by the compiled step.

``FilterGate.named`` puts a producer whose topic's chain only seals into
the compiled step's ``sealing`` set when the client asks for it, before the
broker answers. A close takes it out again (``FilterGate.closed``), but a
PRODUCER the broker refuses (an ERROR: not authorized, topic terminated,
producer busy...) does not: the correlator forgets the id, the gate keeps
it. The client's next PRODUCER with that id, on another topic, is then
never looked at (``named`` skips ids in ``compiled``), and the step seals
its SENDs with the first topic's key: the other topic gets ciphertext its
consumers cannot read, and any filter of that topic (a schema's) is
skipped. The Python path, the reference, sends them as they came."""

from __future__ import annotations

from sluice.filters.chain import Filters
from sluice.protocols.pulsar import command, encode, pb
from tests.test_compiled_seal import (  # noqa: F401 (fixtures)
    PLAIN_TOPIC,
    SEALED_TOPIC,
    filters,
    fixed_iv,
    receipt,
    relay,
    send,
)

T = pb.BaseCommand


def test_a_refused_producers_id_on_another_topic_is_not_sealed_by_the_step(
    filters: Filters,  # noqa: F811
) -> None:
    asked = pb.CommandProducer(topic=SEALED_TOPIC, producer_id=7, request_id=20)
    refused = pb.CommandError(request_id=20, error=pb.AuthorizationError, message="no")
    again = pb.CommandProducer(topic=PLAIN_TOPIC, producer_id=7, request_id=21)
    reads = [
        (True, send(1, 0, [b"sealed: the key is made here"])),  # arms the step's key
        (False, receipt(1, 0)),
        (True, encode(command(T.PRODUCER, asked))),
        (False, encode(command(T.ERROR, refused))),
        (True, encode(command(T.PRODUCER, again))),
        (False, encode(command(T.PRODUCER_SUCCESS,
                               pb.CommandProducerSuccess(request_id=21, producer_name="p7")))),
        (True, send(7, 0, [b"plain topic, plain text"])),
    ]  # fmt: skip
    by_core, _ = relay(filters, reads, quick=False)
    assert b"plain topic, plain text" in by_core[0][True]  # the reference
    by_step, _ = relay(filters, reads, quick=True)
    assert b"plain topic, plain text" in by_step[0][True]
    assert by_step == by_core
