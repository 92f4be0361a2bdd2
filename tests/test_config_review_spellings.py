"""Settings from a --config file: what the file says is read as it says,
or refused in one line, never read one way of two."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.commands import main

BROKER = 'broker = "pulsar://127.0.0.1:1"\n'


@pytest.mark.parametrize(
    "table",
    [
        "max-connections = 5\nmax_connections = 7\n",
        "[proxy]\nmax_connections = 7\nmax-connections = 5\n",
    ],
    ids=["top-level", "proxy-table"],
)
def test_both_spellings_of_one_setting_in_one_table_are_refused(
    table: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """max-connections and max_connections are one setting: given both in
    the same table, one of them was silently dropped (whichever TOML listed
    last), so the proxy ran with a limit the operator may not have meant."""
    path = tmp_path / "sluice.toml"
    path.write_text(BROKER + table)
    assert main(["proxy", "--config", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "max-connections" in err and "max_connections" in err, err
    assert "one setting" in err, err


def test_a_table_over_the_top_level_is_still_a_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The [proxy] table over the top level (in either spelling) stays what
    it was: the command's own table wins."""
    path = tmp_path / "sluice.toml"
    path.write_text(BROKER + "max_connections = 5\n[proxy]\nmax-connections = 7\n")
    assert main(["proxy", "--config", str(path), "--print-config"]) == 0
    assert "max-connections = 7  # file" in capsys.readouterr().out
