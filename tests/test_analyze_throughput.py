"""The report's throughput picture over recordings with a gap (no Spark)."""

from __future__ import annotations

from typing import Any

from sluice.analyze.report import throughput_values


def row(step: int, command: str, messages: int) -> dict[str, Any]:
    return {"step": step, "command": command, "direction": "client_to_broker",
            "topic": "persistent://public/default/t", "other_topic": False, "code": None,
            "frames": 1, "messages": messages, "bytes": 10}  # fmt: skip


def test_steps_with_no_frame_break_the_line_and_quiet_steps_are_zero() -> None:
    """A week of captures with the recorder off at night: the line must not
    run straight from the evening's rate to the morning's as if messages
    went on, and a step with frames but no messages is a true zero."""
    summary = {"step": 10, "over_time": [row(0, "SEND", 50), row(1, "PING", 0),
                                         row(4, "SEND", 20)]}  # fmt: skip
    steps, lines = throughput_values(summary, "client_to_broker")
    assert steps == [0, 1, 2, 3, 4]
    assert lines == [("public/default/t", [5.0, 0.0, None, None, 2.0])]


def test_no_messages_one_way_is_no_line() -> None:
    summary = {"step": 1, "over_time": [row(0, "SEND", 1)]}
    assert throughput_values(summary, "broker_to_client") == ([], [])
