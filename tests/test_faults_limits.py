"""Fault rules at the edges of what they may hold: numbers past a float's
range, globs whose compiling would stall the event loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluice.protocols.faults import FaultError, load_rules, parse_rule
from sluice.proxy.config import PROTOCOL_FAULTS

HUGE = 10**400  # JSON reads it as an int; no float holds it


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"action": "drop", "after": HUGE}, "after must be at most"),
        ({"action": "drop", "times": HUGE}, "times must be at most"),
        ({"action": "drop", "probability": HUGE}, "probability is between 0 and 1"),
        ({"action": "delay", "delay_ms": HUGE}, "delay_ms must be at most"),
        ({"action": "throttle", "rate": HUGE}, "rate must be at most"),
        ({"action": "drop", "after": -HUGE}, "after must be at least 0"),
    ],
)
def test_numbers_past_a_floats_range_are_refused_with_the_reason(
    data: dict[str, Any], message: str
) -> None:
    # They raised OverflowError: a 500 and a traceback on POST /faults, a
    # proxy that would not start on --faults, with a traceback.
    with pytest.raises(FaultError) as info:
        parse_rule(data, PROTOCOL_FAULTS)
    assert message in str(info.value)


def test_a_rules_file_with_a_huge_number_names_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    path.write_text('[{"action": "drop"}, {"action": "drop", "times": 1' + "0" * 400 + "}]")
    with pytest.raises(FaultError) as info:
        load_rules(path, PROTOCOL_FAULTS)
    assert "rule 2: times must be at most" in str(info.value)


def test_large_but_usable_counts_still_pass() -> None:
    rule = parse_rule({"action": "drop", "after": 10**15, "times": 10**15}, PROTOCOL_FAULTS)
    assert (rule.after, rule.times) == (10**15, 10**15)
    assert json.loads(json.dumps(rule.to_json()))["after"] == 10**15
