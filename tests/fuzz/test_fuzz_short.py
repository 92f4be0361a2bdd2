"""The short fuzz run of ``./dev test``: each harness under atheris, from its
seed corpus, for a fixed number of executions (libFuzzer's seed fixed, so a
run repeats). The long run is ``bench/fuzz.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.common import CORPUS, HARNESSES
from tests.fuzz.runner import fuzz

# Executions per harness: 3 to 15 s each on a shared 2-core machine, about 55 s in all.
RUNS = {
    "pulsar_codec": 4000,
    "pulsar_payload": 10000,
    "cursus_codec": 4000,
    "pulsar_proxy": 4000,
    "proxy_header": 20000,
    "recording": 150,
}


def test_every_harness_has_a_short_run_and_seeds() -> None:
    assert set(RUNS) == set(HARNESSES)
    for name in HARNESSES:
        assert len(list((CORPUS / name).iterdir())) >= 4, name


@pytest.mark.parametrize("harness", HARNESSES)
@pytest.mark.e2e
def test_fuzzing_finds_nothing(harness: str, tmp_path: Path) -> None:
    run = fuzz(harness, tmp_path, runs=RUNS[harness], seed=1, timeout=300)
    if run.failure is not None:
        found = run.artifact.read_bytes() if run.artifact is not None else b""
        pytest.fail(
            f"fuzz_{harness} found a bug after {run.executions} executions; the input "
            f"({len(found)} bytes, keep it in tests/fuzz/crashes/{harness}/): "
            f"{found[:200]!r}\n{run.failure}",
            pytrace=False,
        )
    assert run.returncode == 0
    assert run.executions >= RUNS[harness], run
    assert run.coverage > 0, run  # Sluice's code was instrumented
