"""Run one fuzz harness under atheris (libFuzzer), Sluice's code instrumented.

    python -m tests.fuzz.runner NAME [libFuzzer flags] [corpus dirs]

NAME is one of ``common.HARNESSES`` (``tests/fuzz/fuzz_NAME.py``); flags and
directories go to libFuzzer as they are (``-runs=N``, ``-max_total_time=S``,
``-seed=N``; new inputs are written to the first directory). A finding
ends the run with libFuzzer's report, the Python traceback and the input
saved as ``crash-*`` (``-artifact_prefix=DIR/``).

``fuzz()`` runs one that way in a subprocess and reads its figures: what
the short run in ``./dev test`` and ``bench/fuzz.py`` use.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz.common import CORPUS, HARNESSES

ROOT = CORPUS.parents[2]
# libFuzzer's status lines: "#4096  pulse  cov: 216 ft: 979 corp: 150/90Kb ..."
_STATUS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/", re.M)
_ARTIFACT = re.compile(r"Test unit written to (\S+)")
_FAILURE = re.compile(r"=== Uncaught Python exception: ===\n(.*?)\n==\d+==", re.S)


@dataclass
class Run:
    """What one run of a harness did."""

    harness: str
    executions: int
    seconds: float
    coverage: int  # libFuzzer's cov: edges of Sluice's bytecode reached
    features: int  # libFuzzer's ft: edges, with how often each was taken
    corpus: int  # inputs kept, seeds included
    returncode: int
    failure: str | None  # the traceback (or libFuzzer's report) of a finding
    artifact: Path | None  # the input that showed it

    @property
    def per_second(self) -> float:
        return self.executions / self.seconds if self.seconds else 0.0


def fuzz(
    harness: str,
    scratch: Path,
    *,
    runs: int | None = None,
    seconds: float | None = None,
    seed: int | None = None,
    timeout: float = 900,
) -> Run:
    """Run ``harness`` in a subprocess from its seeds (``corpus/<harness>``),
    for ``runs`` executions or ``seconds``, whichever ends first. New inputs
    and any finding go to ``scratch``; the seed corpus is never written."""
    grown = scratch / f"{harness}-corpus"
    grown.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "tests.fuzz.runner", harness, f"-artifact_prefix={scratch}/"]
    args += ["-print_final_stats=1", "-timeout=60"]
    if runs is not None:
        args.append(f"-runs={runs}")
    if seconds is not None:
        args.append(f"-max_total_time={max(1, round(seconds))}")
    if seed is not None:
        args.append(f"-seed={seed}")
    args += [str(grown), str(CORPUS / harness)]
    started = time.monotonic()
    done = subprocess.run(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout
    )
    elapsed = time.monotonic() - started
    output = done.stdout.decode(errors="replace")
    statuses = _STATUS.findall(output)
    executed = re.search(r"stat::number_of_executed_units: (\d+)", output)
    last = statuses[-1] if statuses else ("0", "0", "0", "0")
    failure = None
    if done.returncode != 0:
        found = _FAILURE.search(output)
        failure = found.group(1).strip() if found else output[-4000:]
    artifact = _ARTIFACT.search(output)
    return Run(
        harness=harness,
        executions=int(executed.group(1)) if executed else int(last[0]),
        seconds=elapsed,
        coverage=int(last[1]),
        features=int(last[2]),
        corpus=int(last[3]),
        returncode=done.returncode,
        failure=failure,
        artifact=Path(artifact.group(1)) if artifact else None,
    )


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in HARNESSES:
        sys.exit(f"usage: python -m tests.fuzz.runner {{{','.join(HARNESSES)}}} [libFuzzer args]")
    import atheris

    name = sys.argv[1]
    # Coverage is measured in Sluice's code; the harness and libraries are not instrumented.
    with atheris.instrument_imports(include=["sluice"]):
        module = importlib.import_module(f"tests.fuzz.fuzz_{name}")
    target: Callable[[bytes], None] = module.TestOneInput
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
