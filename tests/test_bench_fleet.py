"""bench/fleet.py's summary of a run: each configuration's msg/s over
direct's, round by round, with its spread and the rounds it is of (no
broker here: the rounds' figures are given)."""

from __future__ import annotations

import argparse
import sys

import pytest

from bench.fleet import Config, Row, Workload, parse_args, ratio_table, ratios_to_direct

UNBATCHED = Workload("unbatched", "1 KiB unbatched", 1024, False, 20000)
DIRECT = Config(None)
ONE = Config("1")
ONE_REC = Config("1", record=True)


def row(
    config: Config, clients: int, round_: int, rate: float, lost: int = 0, failed: str = ""
) -> Row:
    return Row(config, clients, UNBATCHED, "produce", rate=rate, round=round_, lost=lost,
               failed=failed)  # fmt: skip


def scripted() -> list[Row]:
    """Three rounds at 4 clients: the broker stalled (*) direct in round 2,
    and through `sluice w=1 rec` in round 1."""
    return [
        row(DIRECT, 4, 0, 100.0),
        row(DIRECT, 4, 1, 200.0),
        row(DIRECT, 4, 2, 50.0, lost=10),  # *
        row(ONE, 4, 0, 90.0),
        row(ONE, 4, 1, 220.0),
        row(ONE, 4, 2, 60.0),
        row(ONE_REC, 4, 0, 80.0),
        row(ONE_REC, 4, 1, 20.0, lost=500),  # *
        row(ONE_REC, 4, 2, 45.0),
    ]


def test_each_round_s_ratio_is_to_direct_of_the_same_round() -> None:
    """sluice w=1: 0.90 and 1.10, median 1.00 (not 155 / 150, nor the lowest
    over the lowest, 60 / 50); round 2 is left out of both sides, as direct
    stalled in it."""
    versus = ratios_to_direct(scripted())
    one = versus[(ONE, 4, "unbatched", "produce")]
    assert [round(r, 3) for r in one.ratios] == [0.9, 1.1]
    assert one.rounds == 3
    assert one.text() == "1.00 (0.90-1.10) 2/3"
    # recording: round 1 stalled on its side, round 2 on direct's: one round left
    rec = versus[(ONE_REC, 4, "unbatched", "produce")]
    assert rec.text() == "0.80 1/3"


def test_a_configuration_with_no_usable_round_says_so() -> None:
    rows = [row(DIRECT, 1, 0, 100.0), row(ONE, 1, 0, 0.0, failed="a client process died")]
    assert ratios_to_direct(rows)[(ONE, 1, "unbatched", "produce")].text() == "- 0/1"


def test_the_table_gives_a_cell_per_configuration_and_client_count() -> None:
    rows = [*scripted(), row(DIRECT, 1, 0, 10.0), row(DIRECT, 1, 1, 12.0), row(ONE, 1, 0, 11.0),
            row(ONE, 1, 1, 8.4)]  # fmt: skip
    text = ratio_table(rows, [DIRECT, ONE, ONE_REC], [UNBATCHED])
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("1 KiB unbatched, produce"))
    assert lines[head].split("  ")[-1].strip() == "4 clients"
    direct, one, rec = lines[head + 1 : head + 4]
    assert direct.startswith("direct (msg/s)") and direct.endswith("150 (100-200) 2/3")
    assert "11 (10-12) 2/2" in direct
    assert one.startswith("sluice w=1 ") and one.endswith("1.00 (0.90-1.10) 2/3")
    assert "0.90 (0.70-1.10) 2/2" in one  # 11 / 10 and 8.4 / 12
    assert rec.startswith("sluice w=1 rec") and rec.endswith("0.80 1/3")
    assert "consume" not in text  # no consume steps were given


def test_three_rounds_unless_quick_or_told(monkeypatch: pytest.MonkeyPatch) -> None:
    def rounds(*argv: str) -> int:
        monkeypatch.setattr(sys, "argv", ["fleet.py", *argv])
        args: argparse.Namespace = parse_args()
        return int(args.rounds)

    assert rounds() == 3
    assert rounds("--quick") == 1
    assert rounds("--quick", "--rounds", "2") == 2
