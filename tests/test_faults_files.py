"""``--faults FILE``: the rules a file gives, and the names of those without one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sluice.protocols.faults import FaultAction, FaultError, Faults, Match, Rule, load_rules
from sluice.proxy.config import PROTOCOL_FAULTS


def test_a_files_rules_without_an_id_are_named_by_their_place(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    path.write_text(json.dumps([{"action": "drop"}, {"id": "slow", "action": "delay",
                                 "delay_ms": 5}, {"action": "drop"}]))  # fmt: skip
    rules = load_rules(path, PROTOCOL_FAULTS)
    assert [r.id for r in rules] == ["file-1", "slow", "file-3"]
    # The same names on every load (a reload, each worker), and none that a
    # rule added at run time is given.
    assert [r.id for r in load_rules(path, PROTOCOL_FAULTS)] == ["file-1", "slow", "file-3"]
    faults = Faults()
    faults.extend(rules)
    assert faults.add(Rule(Match(), FaultAction.DROP)).id == "f1"


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (
            [{"id": "a", "action": "drop"}, {"id": "a", "action": "drop"}],
            "rule 2: id 'a' is rule 1's",
        ),
        (
            [{"id": "file-2", "action": "drop"}, {"action": "drop"}],
            "rule 2: id 'file-2' is rule 1's",
        ),
    ],
)
def test_a_file_naming_one_id_twice_is_refused_with_the_rules_number(
    tmp_path: Path, rules: list[object], message: str
) -> None:
    path = tmp_path / "faults.json"
    path.write_text(json.dumps(rules))
    with pytest.raises(
        FaultError, match=f"^--faults {re.escape(str(path))}: {re.escape(message)}$"
    ):
        load_rules(path, PROTOCOL_FAULTS)
