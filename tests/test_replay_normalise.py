"""What replay compares of a broker frame: values that differ from run to
run whatever the broker does are left out, the rest is kept."""

from __future__ import annotations

from typing import Any

from sluice.protocols.pulsar import Frame, Type, command, decode_frame, encode, pb
from sluice.replay.pulsar import normalise

T = Type.Value


def frame(name: str, body: Any) -> Frame:
    return decode_frame(encode(command(T(name), body)))


def stats(**fields: Any) -> pb.CommandConsumerStatsResponse:
    base: dict[str, Any] = {"request_id": 7, "consumerName": "c", "availablePermits": 990,
                            "unackedMessages": 3, "msgBacklog": 10}  # fmt: skip
    return pb.CommandConsumerStatsResponse(**{**base, **fields})


def test_consumer_stats_compare_state_not_rates_addresses_or_times() -> None:
    recorded = stats(msgRateOut=12.5, msgThroughputOut=800.0, msgRateRedeliver=0.5,
                     msgRateExpired=0.1, messageAckRate=3.0, address="/127.0.0.1:40112",
                     connectedSince="2026-12-07T03:00:00Z")  # fmt: skip
    live = stats(msgRateOut=3.2, msgThroughputOut=210.0, msgRateRedeliver=0.0,
                 msgRateExpired=0.0, messageAckRate=1.0, address="/127.0.0.1:51876",
                 connectedSince="2026-12-07T04:10:31Z")  # fmt: skip
    name = "CONSUMER_STATS_RESPONSE"
    assert normalise(frame(name, recorded)) == normalise(frame(name, live))
    # What the broker's state decides is still compared.
    for changed in ({"msgBacklog": 11}, {"unackedMessages": 0}, {"availablePermits": 1000}):
        assert normalise(frame(name, stats(**changed))) != normalise(frame(name, stats()))
