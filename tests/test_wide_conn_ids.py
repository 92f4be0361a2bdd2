"""Connection ids count up for the proxy's life (by the number of workers
with --workers) and never wrap: one past 2**32 - 1 is relayed by the
compiled step as by the core, the reference, on the same reads. Before,
the step took the id as a uint32, and from id 2**32 on every proxied
Pulsar connection failed at its handshake (the step is made when the
broker's CONNECTED comes). Recorded, such a connection's reads all go
the Python way (the compiled layout's "c" is a uint32), and its records
say its id."""

from __future__ import annotations

from pathlib import Path

from sluice.protocols.core import Taps
from sluice.protocols.pulsar.connection import PulsarConnection
from sluice.recording.format import PayloadPolicy
from sluice.recording.writer import Recorder, RecorderConfig
from tests.test_compiled_frames import proxied, traffic
from tests.test_quick_step import EVERYDAY, records, relay

WIDE = 2**32


def wide(taps: Taps) -> PulsarConnection:
    return proxied(taps, conn_id=WIDE)


def test_a_connection_id_past_32_bits_is_relayed_by_the_step_as_by_the_core() -> None:
    reads = EVERYDAY + traffic(0, True)
    by_step, carried = relay(reads, True, connection=wide)
    assert carried >= len(EVERYDAY), "the step carried reads"
    by_core, _ = relay(reads, False, connection=wide)
    assert by_step == by_core


def test_a_connection_id_past_32_bits_is_recorded_the_same_either_way(tmp_path: Path) -> None:
    by = {}
    for quick in (True, False):
        recorder = Recorder(RecorderConfig(tmp_path / str(quick), PayloadPolicy.HASH))
        result, carried = relay(EVERYDAY, quick, recorder, wide)
        assert carried == 0  # laid out in Python: the compiled record's id is a uint32
        by[quick] = (result, records(recorder))
    assert by[True] == by[False]
    assert {r["c"] for r in by[True][1]} == {WIDE}
