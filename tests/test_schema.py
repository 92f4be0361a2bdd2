"""Our schema against upstream's wire contract, and the generated module against our schema.

The upstream contract is data the repository owns (``tests/data/
pulsar_wire_contract.json``, see ``tests/helpers/wire_contract.py``): nothing here
reads outside the checkout.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from sluice.protocols.pulsar import regen
from tests.helpers.wire_contract import CONTRACT, comment_lines, contract_of, descriptor, digest


def _upstream() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CONTRACT.read_text())
    return data


def _differences(ours: dict[str, Any], upstream: dict[str, Any]) -> list[str]:
    problems = []
    for kind in ("messages", "enums"):
        mine, theirs = ours[kind], upstream[kind]
        problems += [f"{kind} missing from ours: {n}" for n in sorted(set(theirs) - set(mine))]
        problems += [f"{kind} not upstream: {n}" for n in sorted(set(mine) - set(theirs))]
        for name in sorted(set(mine) & set(theirs)):
            if mine[name] != theirs[name]:
                problems.append(f"{name}:\n  ours     {mine[name]}\n  upstream {theirs[name]}")
    for key in ("package", "syntax"):
        if ours[key] != upstream[key]:
            problems.append(f"{key}: ours {ours[key]!r}, upstream {upstream[key]!r}")
    return problems


def test_schema_matches_upstream_wire_contract() -> None:
    upstream = _upstream()
    ours = contract_of(descriptor(regen.SCHEMA))
    problems = _differences(ours, upstream)
    assert not problems, "\n".join(problems)
    # The comparison saw the whole protocol (v21: 93 messages, 19 enums).
    assert len(upstream["messages"]) > 90 and len(upstream["enums"]) > 15
    assert "CommandSend" in upstream["messages"]


def test_contract_comparison_sees_a_wire_change(tmp_path: Path) -> None:
    """A renumbered field is reported: the check can fail."""
    text = regen.SCHEMA.read_text()
    field = "required uint64 sequence_id = "
    changed = text.replace(field + "2;", field + "12;", 1)
    assert changed != text
    schema = tmp_path / regen.SCHEMA.name
    schema.write_text(changed)
    problems = _differences(contract_of(descriptor(schema)), _upstream())
    assert any("sequence_id" in p for p in problems), problems


def test_schema_has_its_own_comments() -> None:
    """No long comment line of ours is one of upstream's (compared by SHA-256)."""
    upstream = set(_upstream()["comment_sha256"])
    assert len(upstream) > 100  # the digests are there to compare with
    copied = sorted(c for c in comment_lines(regen.SCHEMA.read_text()) if digest(c) in upstream)
    assert not copied, f"comments copied from upstream: {copied}"


def test_generated_module_is_current() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for fresh in regen.generate(Path(tmp)):
            committed = regen.HERE / fresh.name
            assert committed.read_text() == fresh.read_text(), (
                f"{committed.name} is stale: run `python -m sluice.protocols.pulsar.regen`"
            )
