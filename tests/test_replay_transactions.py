"""Replay of a transactional session: the transaction ids the coordinator
gives are its choice, like message ids: the live ones go out in the
client's frames, and answers are compared without them."""

from __future__ import annotations

from typing import Any

from sluice.protocols.pulsar import Frame, Type, command, decode_frame, encode, encode_payload, pb
from sluice.replay.pulsar import Remap, normalise

T = Type.Value


def frame(name: str, body: Any) -> Frame:
    return decode_frame(encode(command(T(name), body)))


def new_txn_response(least: int) -> Frame:
    return frame("NEW_TXN_RESPONSE", pb.CommandNewTxnResponse(
        request_id=1, txnid_most_bits=0, txnid_least_bits=least))  # fmt: skip


def transactional_send(least: int) -> Frame:
    send = pb.CommandSend(producer_id=0, sequence_id=3, txnid_most_bits=0, txnid_least_bits=least)
    meta = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=1,
                              txnid_most_bits=0, txnid_least_bits=least)  # fmt: skip
    return decode_frame(encode_payload(command(T("SEND"), send), meta, b"in a txn", checksum=True))


def test_client_frames_name_the_transaction_the_live_coordinator_gave() -> None:
    remap = Remap()
    remap.learn(new_txn_response(5), new_txn_response(12))  # recorded 5, live 12
    sent = decode_frame(remap.client_frame(transactional_send(5)))
    body: Any = sent.body
    assert sent.metadata is not None and bytes(sent.payload) == b"in a txn"
    assert (body.txnid_most_bits, body.txnid_least_bits) == (0, 12)
    assert sent.metadata.txnid_least_bits == 12
    for name, request in (
        ("ACK", pb.CommandAck(consumer_id=0, ack_type=pb.CommandAck.Individual,
                              txnid_most_bits=0, txnid_least_bits=5)),
        ("ADD_PARTITION_TO_TXN", pb.CommandAddPartitionToTxn(
            request_id=2, txnid_most_bits=0, txnid_least_bits=5, partitions=["t"])),
        ("END_TXN", pb.CommandEndTxn(request_id=3, txnid_most_bits=0, txnid_least_bits=5,
                                     txn_action=pb.COMMIT)),
    ):  # fmt: skip
        again: Any = decode_frame(remap.client_frame(frame(name, request))).body
        assert again.txnid_least_bits == 12, name
    # A transaction the recording did not begin is sent as recorded.
    other: Any = decode_frame(remap.client_frame(transactional_send(6))).body
    assert other.txnid_least_bits == 6


def test_answers_are_compared_without_the_transaction_id() -> None:
    assert normalise(new_txn_response(5)) == normalise(new_txn_response(12))
    ended = [frame("END_TXN_RESPONSE", pb.CommandEndTxnResponse(
        request_id=3, txnid_most_bits=0, txnid_least_bits=least)) for least in (5, 12)]  # fmt: skip
    assert normalise(ended[0]) == normalise(ended[1])
    # The message a consumer gets carries its producer's transaction too.
    assert normalise(transactional_send(5)) == normalise(transactional_send(12))
    # An error is still an error.
    failed = pb.CommandEndTxnResponse(request_id=3, txnid_most_bits=0, txnid_least_bits=12,
                                      error=pb.TransactionNotFound)  # fmt: skip
    assert normalise(frame("END_TXN_RESPONSE", failed)) != normalise(ended[0])
