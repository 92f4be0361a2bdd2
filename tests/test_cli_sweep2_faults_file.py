"""Mistakes in a ``--faults`` file given to ``sluice proxy``: the message
names the flag and the file (it named the path alone, or nothing but the
rule, and the user had to guess which input was wrong)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.commands import main

BROKER = "pulsar://127.0.0.1:1"  # never dialled: the file is refused first


def _proxy(faults: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["proxy", "--broker", BROKER, "--listen", "127.0.0.1:0",
                 "--faults", str(faults)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_faults_file_with_a_jitter_larger_than_the_delay_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"action": "delay", "delay_ms": 10, "jitter_ms": 50}]))
    assert _proxy(rules, capsys) == (
        f"sluice proxy: --faults {rules}: rule 1: jitter_ms 50 is more than delay_ms 10: "
        "a delay cannot go below 0 (give a jitter of at most the delay)\n"
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (None, "No such file or directory"),
        ("{", "not JSON: "),
        ('{"rule": []}', 'expected a list of rules or {"rules": [...]}'),
        ('[{"action": "nope"}]', "rule 1: action must be one of "),
        ('[{"action": "drop", "id": "a"}, {"action": "drop", "id": "a"}]', "rule 2: id 'a' is "),
    ],
)
def test_a_faults_file_mistake_names_the_flag_and_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, said: str
) -> None:
    rules = tmp_path / "rules.json"
    if text is not None:
        rules.write_text(text)
    err = _proxy(rules, capsys)
    assert err.startswith(f"sluice proxy: --faults {rules}: {said}"), err
