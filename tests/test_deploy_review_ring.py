"""The Helm chart's flight-recorder checks for a ring given as a time
(recording.ring: 300s): Sluice bounds such a ring in memory too (256 MiB a
worker), and refuses a retention that cannot hold a snapshot of it; the
chart must refuse what Sluice refuses, not install pods that crash-loop."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sluice.commands import parse_again
from sluice.commands.proxy import checked_config
from sluice.errors import ConfigError
from sluice.recording.writer import RING_BYTES_WITH_SECONDS
from tests.test_helm import BROKER, CHART, helm

pytestmark = pytest.mark.e2e  # helm runs as a process


def _toml(*values: str) -> str:
    result = helm("template", "sluice", str(CHART), "--set", f"broker={BROKER}", *values)
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and "sluice.toml" in d["data"]]
    text: str = config["data"]["sluice.toml"]
    return text


def _refusal(*values: str) -> str:
    result = helm("template", "sluice", str(CHART), "--set", f"broker={BROKER}", *values,
                  check=False)  # fmt: skip
    assert result.returncode != 0, "helm rendered it"
    return result.stderr


def _sluice_takes(toml: str, tmp_path: Path) -> str | None:
    """None when `sluice proxy` starts with this sluice.toml (its checks at
    start); else its one line."""
    path = tmp_path / "sluice.toml"
    path.write_text(toml.replace('"/recordings"', f'"{tmp_path / "rec"}"'))
    try:
        checked_config(parse_again(["proxy", "--config", str(path)]))
    except ConfigError as exc:
        return str(exc)
    return None


RING = ["--set", "recording.mode=ring", "--set", "recording.ring=300s"]


def test_a_time_ring_that_sluice_refuses_is_refused_by_helm(tmp_path: Path) -> None:
    """recording.ring 300s with retainBytes 200M: helm rendered it, and
    every pod then exited at start (--record-ring holds up to 268435456
    bytes, more than three quarters of --record-retain-bytes)."""
    small = [*RING, "--set", "recording.retainBytes=200M"]
    err = _refusal(*small)
    assert "recording.ring 300s" in err and "three quarters" in err, err
    # Two workers need twice the room; one fits in the default 800M.
    assert "three quarters" in _refusal(*RING, "--set", "workers=2", "--set",
                                        "recording.retainBytes=600M")  # fmt: skip
    fits = _toml(*RING)
    assert _sluice_takes(fits, tmp_path) is None


def test_what_the_chart_refuses_for_a_time_ring_sluice_refuses_too(tmp_path: Path) -> None:
    """The chart's bound is Sluice's own: 200M is refused by both."""
    path = tmp_path / "sluice.toml"
    path.write_text(f'broker = "{BROKER}"\nrecord = "{tmp_path / "rec"}"\n'
                    'record-ring = "300s"\nrecord-retain-bytes = "200M"\n')  # fmt: skip
    with pytest.raises(ConfigError, match="three quarters"):
        checked_config(parse_again(["proxy", "--config", str(path)]))
    assert RING_BYTES_WITH_SECONDS == 256 * 2**20  # the chart's figure


def test_a_time_ring_counts_in_the_memory_limit() -> None:
    """A sidecar's default limit (256Mi) with a 300s ring: the ring alone
    may hold 256 MiB, so the container would be OOM-killed once it fills;
    a ring given as a size is held to workers x (ring + 64Mi), and so is
    this one now."""
    err = _refusal(*RING, "--set", "sidecar.resources.limits.memory=256Mi",
                   "--set", "mode=sidecar")  # fmt: skip
    assert "leaves no room for the ring" in err, err
    err = _refusal(*RING, "--set", "gateway.resources.limits.memory=256Mi")
    assert "leaves no room for the ring" in err, err
