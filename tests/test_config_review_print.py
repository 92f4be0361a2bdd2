"""--print-config: its output is a config file that reads back as the same
settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.commands import main


@pytest.mark.parametrize("ring", ["64M", "300s", "1.5s", "1048576"])
def test_a_printed_record_ring_reads_back_as_the_same_ring(
    ring: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--print-config wrote --record-ring as its parsed pair ("None,300.0",
    "67108864,None"), which no --record-ring reads: the printed file, fed
    back with --config, was refused."""
    argv = ["proxy", "--broker", "pulsar://127.0.0.1:1", "--record", str(tmp_path / "rec"),
            "--record-ring", ring, "--print-config"]  # fmt: skip
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "None" not in first
    printed = tmp_path / "printed.toml"
    printed.write_text(first)
    assert main(["proxy", "--config", str(printed), "--print-config"]) == 0, capsys.readouterr()
    again = capsys.readouterr().out

    def values(text: str) -> list[str]:
        return [line.rsplit("  # ", 1)[0] for line in text.splitlines()[1:]]

    assert values(again) == values(first)
