"""``sluice record anonymize`` and the names annotations carry: a fault
record's ``rule`` (a fault rule's id), a filter record's ``filter`` (its
name or label) and ``reason`` (a refusal's code). They were scrubbed of the
names other fields held only, so a name none of those held stayed in the
copy, and the pairing of a filter record with the filter (or a fault record
with the snapshot its rule fired) was lost. They are pseudonyms now, as a
snapshot's reason and rule id are, but for what Sluice writes itself."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from sluice.filters import schemas
from sluice.recording import format as fmt
from sluice.recording.anonymize import _OWN_FILTER_REASONS, _OWN_FILTERS, Options, anonymize
from sluice.recording.format import read_records, recording_files
from tests.test_anonymize_records import KEY, capture_file

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "persistent://public/default/t"


def copied(out: Path) -> tuple[bytes, list[dict[str, object]]]:
    files = recording_files(out)
    data = b"".join(p.read_bytes() for p in files)
    return data, [dict(r) for p in files for r in read_records(p)]


def fault(rule: str) -> fmt.Record:
    return {"k": "fault", "c": 1, "d": 0, "t": 1, "w": 1, "rule": rule, "action": "delay",
            "cmd": "SEND", "topic": TOPIC}  # fmt: skip


def filtered(name: str, action: str, reason: str = "") -> fmt.Record:
    record: fmt.Record = {"k": "filter", "c": 1, "d": 0, "t": 1, "w": 1, "filter": name,
                          "action": action, "n": 1, "topic": TOPIC}  # fmt: skip
    if reason:
        record["reason"] = reason
    return record


def test_a_fault_rule_id_is_one_pseudonym_in_its_records_and_the_snapshot_it_fired(
    tmp_path: Path,
) -> None:
    """A fault rule's id (``hold-payroll-eu``) named nothing else in the
    capture: the fault record kept it. Now the fault records, the trigger it
    fired (``fault``), that trigger's snapshot (``fault``) and the close it
    caused take one pseudonym for it."""
    rule = "hold-payroll-eu"
    trigger = {"k": "trigger", "t": 2, "w": 2, "c": 1, "rule": "on-hold",
               "on": "fault", "cmd": "SEND", "fault": rule, "action": "delay"}  # fmt: skip
    snapshot = {"k": "snapshot", "t": 3, "w": 3, "seconds": 3, "reason": "on-hold",
                "rule": "on-hold", "on": "fault", "c": 1, "cmd": "SEND",
                "fault": rule, "action": "delay"}  # fmt: skip
    closed = {"k": "close", "c": 1, "t": 5, "w": 5,
              "reason": f"fault {rule}: disconnecting after SEND"}  # fmt: skip
    source = capture_file(tmp_path / "in.sluice", fault(rule), trigger, snapshot, fault(rule),
                          closed)  # fmt: skip
    _, names = anonymize(source, tmp_path / "out", Options(KEY))
    data, records = copied(tmp_path / "out")
    assert b"payroll" not in data
    pseudonym = names.name("name", rule)
    assert pseudonym.startswith("name-")
    faults = [r for r in records if r["k"] == "fault"]
    assert [r["rule"] for r in faults] == [pseudonym, pseudonym]
    (fired,) = [r for r in records if r["k"] == "trigger"]
    (saved,) = [r for r in records if r["k"] == "snapshot"]
    assert fired["fault"] == saved["fault"] == pseudonym
    assert fired["rule"] == saved["rule"] == saved["reason"] == names.name("name", "on-hold")
    (close,) = [r for r in records if r["k"] == "close"]
    assert close["reason"] == f"fault {pseudonym}: disconnecting after SEND"
    # The codes stay as they were.
    assert [(r["action"], r["cmd"]) for r in faults] == [("delay", "SEND")] * 2
    assert (fired["on"], fired["action"]) == ("fault", "delay")


def test_a_fault_rule_and_a_snapshot_rule_of_one_id_take_one_pseudonym(tmp_path: Path) -> None:
    rule = "hold-payroll-eu"
    same = {"k": "snapshot", "t": 4, "w": 4, "seconds": 3, "reason": rule, "rule": rule}
    source = capture_file(tmp_path / "in.sluice", fault(rule), same)
    _, names = anonymize(source, tmp_path / "out", Options(KEY))
    _, records = copied(tmp_path / "out")
    (faulted,) = [r for r in records if r["k"] == "fault"]
    (saved,) = [r for r in records if r["k"] == "snapshot"]
    assert faulted["rule"] == saved["rule"] == saved["reason"] == names.name("name", rule)


def test_a_users_filter_and_reason_are_pseudonyms_and_sluices_own_stay(tmp_path: Path) -> None:
    """A filter's name (``module:attr``, a label) and its refusal's reason
    are the user's words: pseudonyms, one per original across the copy. The
    names of Sluice's own filters and the reasons Sluice gives (codes that
    hold no topic, schema or message) stay, so the copy still says why."""
    mine, label, reason = "initech_filters:PayrollMask", "payroll-mask", "salary_leak"
    records_in = [
        filtered(mine, "rejected", reason),
        filtered(label, "replaced"),
        filtered(mine, "error", "closed"),
        filtered(label, "rejected", reason),
        filtered("schema", "rejected", "not_avro"),
        filtered("schema", "rejected", "no_schema"),
        filtered("encrypt", "rejected", "undecryptable"),
        filtered("encrypt", "error", "open"),
        filtered("?", "rejected", "filter_error"),
        filtered(label, "rejected", "too_large"),
    ]
    source = capture_file(tmp_path / "in.sluice", *records_in)
    _, names = anonymize(source, tmp_path / "out", Options(KEY))
    data, records = copied(tmp_path / "out")
    for original in (b"initech", b"Payroll", b"payroll", b"salary"):
        assert original not in data, original
    got = [(r["filter"], r["action"], r.get("reason", "")) for r in records if r["k"] == "filter"]
    mine_p, label_p, reason_p = (names.name("name", n) for n in (mine, label, reason))
    assert len({mine_p, label_p, reason_p}) == 3
    assert got == [
        (mine_p, "rejected", reason_p),
        (label_p, "replaced", ""),
        (mine_p, "error", "closed"),
        (label_p, "rejected", reason_p),
        ("schema", "rejected", "not_avro"),
        ("schema", "rejected", "no_schema"),
        ("encrypt", "rejected", "undecryptable"),
        ("encrypt", "error", "open"),
        ("?", "rejected", "filter_error"),
        (label_p, "rejected", "too_large"),
    ], got


def test_ids_sluice_gives_rules_without_one_stay(tmp_path: Path) -> None:
    """A fault rule without an id is ``f1`` (added on /faults) or ``file-2``
    (by its place in a --faults file), a snapshot rule ``t3``: Sluice's
    numbering, no user's words, kept so that the copy still reads as the
    capture's log lines and metrics do."""
    trigger = {"k": "trigger", "t": 2, "w": 2, "c": 1, "rule": "t3", "on": "fault",
               "cmd": "SEND", "fault": "file-2", "action": "delay"}  # fmt: skip
    source = capture_file(tmp_path / "in.sluice", fault("f1"), fault("file-2"), trigger)
    anonymize(source, tmp_path / "out", Options(KEY))
    _, records = copied(tmp_path / "out")
    assert [r["rule"] for r in records if r["k"] == "fault"] == ["f1", "file-2"]
    (fired,) = [r for r in records if r["k"] == "trigger"]
    assert (fired["rule"], fired["fault"]) == ("t3", "file-2")


def test_sluices_own_filters_and_reasons_are_all_known() -> None:
    """The filters Sluice ships (its ``sluice.filters`` entry points) and
    every refusal reason it writes itself: a new one missing here would be
    made a pseudonym, and the copy would no longer say why."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = set(project["project"]["entry-points"]["sluice.filters"])
    assert shipped | {"?"} == set(_OWN_FILTERS)
    written = set()
    for path in (ROOT / "sluice").rglob("*.py"):
        written |= set(re.findall(r'Reject\(\s*"([a-z_]+)"', path.read_text()))
    # The schema filter's mismatch reasons: its module's public constants.
    mismatches = {
        v for k, v in vars(schemas).items() if k.isupper() and k[0] != "_" and isinstance(v, str)
    }
    assert written and mismatches
    missing = (written | mismatches | {"open", "closed"}) - set(_OWN_FILTER_REASONS)
    assert not missing, missing
