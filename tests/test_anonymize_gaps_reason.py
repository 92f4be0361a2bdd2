"""``sluice record anonymize`` and a snapshot's reason: free text a user
wrote (an admin request's ``reason``, a ``--snapshot-on`` rule's id), which
can name what no other field of the capture names."""

from __future__ import annotations

from pathlib import Path

from sluice.recording.anonymize import Options, anonymize
from sluice.recording.format import read_records, recording_files
from tests.test_anonymize_records import KEY, capture_file


def copied(out: Path) -> tuple[bytes, list[dict[str, object]]]:
    files = recording_files(out)
    data = b"".join(p.read_bytes() for p in files)
    return data, [dict(r) for p in files for r in read_records(p)]


def test_a_reason_naming_a_topic_nothing_else_names_is_not_in_the_copy(tmp_path: Path) -> None:
    """The reason was scrubbed of the names the capture's fields held only:
    a topic (or a host) named by the reason alone stayed in the copy."""
    reason = "lag on payroll-eu-salaries from db7.initech.corp"
    on_demand = {"k": "snapshot", "t": 1, "w": 1, "seconds": 3, "reason": reason}
    sluices = {"k": "snapshot", "t": 2, "w": 2, "seconds": 3, "reason": "on demand"}
    source = capture_file(tmp_path / "in.sluice", on_demand, sluices)
    _, names = anonymize(source, tmp_path / "out", Options(KEY))
    data, records = copied(tmp_path / "out")
    for original in (b"payroll", b"salaries", b"initech", b"db7"):
        assert original not in data, original
    reasons = [r["reason"] for r in records if r["k"] == "snapshot"]
    # The user's reason: a pseudonym; Sluice's own word for it: kept.
    assert reasons == [names.name("name", reason), "on demand"], reasons


def test_a_rule_id_is_one_pseudonym_in_its_trigger_and_its_snapshot(tmp_path: Path) -> None:
    """A triggered snapshot's reason is the rule's id, which the trigger
    record (``rule``) and the snapshot record (``rule``, ``reason``) carry:
    one pseudonym for it in all three, so the copy still pairs them."""
    rule = "payroll-eu-salaries-slow"
    trigger = {"k": "trigger", "t": 1, "w": 1, "c": 1, "rule": rule, "on": "slow",
               "cmd": "SEND", "seconds": 2.5}  # fmt: skip
    snapshot = {"k": "snapshot", "t": 2, "w": 2, "seconds": 3, "reason": rule, "rule": rule,
                "on": "slow", "c": 1, "cmd": "SEND"}  # fmt: skip
    source = capture_file(tmp_path / "in.sluice", trigger, snapshot)
    anonymize(source, tmp_path / "out", Options(KEY))
    data, records = copied(tmp_path / "out")
    assert b"payroll" not in data and b"salaries" not in data
    (fired,) = [r for r in records if r["k"] == "trigger"]
    (saved,) = [r for r in records if r["k"] == "snapshot"]
    assert fired["rule"] == saved["rule"] == saved["reason"] != rule
    assert str(saved["reason"]).startswith("name-")
    # The codes saying what fired it stay as they were.
    assert (fired["on"], fired["cmd"], saved["on"], saved["cmd"]) == ("slow", "SEND") * 2
