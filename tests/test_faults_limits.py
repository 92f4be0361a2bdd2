"""Fault rules at the edges of what they may hold: numbers past a float's
range, globs whose compiling would stall the event loop."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.protocols.faults import MAX_GLOB, FaultError, Faults, load_rules, parse_rule
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


@pytest.mark.parametrize("key", ["topic", "client"])
def test_a_glob_too_long_to_compile_quickly_is_refused(key: str) -> None:
    # fnmatch compiles a glob on first use, on the event loop, in a time
    # that grows with the square of its unclosed '[': 60 KiB of them (one
    # POST /faults) held every connection of the proxy for about a minute.
    with pytest.raises(FaultError) as info:
        parse_rule({"match": {key: "[" * 5000}, "action": "drop"}, PROTOCOL_FAULTS)
    assert f"match.{key} is at most {MAX_GLOB} characters" in str(info.value)


def test_the_longest_glob_allowed_is_matched_without_a_stall() -> None:
    faults = Faults()
    faults.add(parse_rule({"match": {"topic": "[" * MAX_GLOB}, "action": "drop"}, PROTOCOL_FAULTS))
    started = time.perf_counter()
    assert faults.check("pulsar", "SEND", True, "10.0.0.1:5000", lambda: "t") is None
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("key", ["topic", "client"])
@pytest.mark.parametrize(
    "bad", ["orders-*\nWARNING sluice.admin: forged line", "a\rb", "x\x1b[2J", "\x7f"]
)
def test_a_glob_with_a_control_character_is_refused(key: str, bad: str) -> None:
    # Globs are logged (at WARNING, as the rule is added) as they are: a
    # newline in one wrote a line of the caller's choosing into the log.
    # No topic, path or client address holds one.
    with pytest.raises(FaultError) as info:
        parse_rule({"match": {key: bad}, "action": "drop"}, PROTOCOL_FAULTS)
    assert f"match.{key} holds a control character" in str(info.value)
