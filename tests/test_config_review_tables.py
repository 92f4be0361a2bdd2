"""A TOML table where a repeatable setting's list belongs: refused in one
line that says so, not read as the Python text of the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.commands import main


@pytest.mark.parametrize(
    "toml",
    [
        '[proxy.allow-broker]\nhosts = "*.svc"\n',
        'sni-route = {"a.example" = "pulsar://10.0.0.1:6651"}\n',
        '[proxy.filters]\nname = "schema"\ntopics = ["persistent://public/default/a*"]\n',
    ],
    ids=["allow-broker", "sni-route", "filters"],
)
def test_a_table_for_a_repeatable_setting_is_refused_as_a_table(
    toml: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table was turned into its Python text ("{'hosts': '*.svc'}") and
    read as one item: refused further on with a message about that text
    ("bad port \" '*.svc'}\"") or a filter name cut at a comma, which
    says nothing of the mistake (a table, not a list; [proxy.filters] for
    [[proxy.filters]])."""
    path = tmp_path / "sluice.toml"
    path.write_text('broker = "pulsar://127.0.0.1:1"\n' + toml)
    assert main(["proxy", "--config", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "expected a list" in err and "not a table" in err, err
    assert "{'" not in err, err
