"""Sizes in the Helm chart's recording values that Sluice refuses at start
(a ring or retention of 0, a retention too small for its workers) are
refused by helm, in one line, not installed as pods that exit at start."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sluice.commands import parse_again
from sluice.commands.proxy import checked_config
from sluice.errors import ConfigError
from sluice.recording.retention import MIN_QUANTUM
from tests.test_helm import BROKER, CHART, helm

pytestmark = pytest.mark.e2e  # helm runs as a process


def _render(*values: str) -> tuple[int, str, str]:
    result = helm("template", "sluice", str(CHART), "--set", f"broker={BROKER}", *values,
                  check=False)  # fmt: skip
    return result.returncode, result.stdout, result.stderr


def _sluice_refusal(rendered: str, tmp_path: Path) -> str | None:
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and "sluice.toml" in d["data"]]
    path = tmp_path / "sluice.toml"
    path.write_text(config["data"]["sluice.toml"].replace('"/recordings"', f'"{tmp_path}/rec"'))
    try:
        checked_config(parse_again(["proxy", "--config", str(path)]))
    except ConfigError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    ("values", "said"),
    [
        (["recording.mode=ring", "recording.ring=0"], "recording.ring 0: a size must be"),
        (["recording.mode=ring", "recording.ring=0s"], "recording.ring 0s: a time must be"),
        (["recording.mode=directory", "recording.retainBytes=0"],
         "recording.retainBytes 0: a size must be positive"),
        (["recording.mode=directory", "recording.retainBytes=100K"], "at least 262144"),
        (["recording.mode=directory", "recording.retainBytes=600K", "workers=3"],
         "at least 786432"),
    ],
    ids=["ring-0", "ring-0s", "retain-0", "retain-100K", "retain-600K-3-workers"],
)  # fmt: skip
def test_a_size_sluice_refuses_is_refused_by_helm(
    values: list[str], said: str, tmp_path: Path
) -> None:
    sets = [a for v in values for a in ("--set", v)]
    code, out, err = _render(*sets)
    assert code != 0, f"helm rendered it; Sluice says: {_sluice_refusal(out, tmp_path)}"
    assert said in err, err


def test_the_smallest_retention_helm_takes_sluice_takes(tmp_path: Path) -> None:
    least = MIN_QUANTUM * 4 * 2
    code, out, err = _render("--set", "recording.mode=directory", "--set", "workers=2",
                             "--set", f"recording.retainBytes={least}")  # fmt: skip
    assert code == 0, err
    assert _sluice_refusal(out, tmp_path) is None
    code, _, err = _render("--set", "recording.mode=directory", "--set", "workers=2",
                           "--set", f"recording.retainBytes={least - 1}")  # fmt: skip
    assert code != 0 and f"at least {least}" in err, err
