"""Run one fuzz harness under atheris (libFuzzer), Sluice's code instrumented.

    python -m tests.fuzz.runner NAME [libFuzzer flags] [corpus dirs]

NAME is one of ``common.HARNESSES`` (``tests/fuzz/fuzz_NAME.py``); flags and
directories go to libFuzzer as they are (``-runs=N``, ``-max_total_time=S``,
``-seed=N``; new inputs are written to the first directory). A finding
ends the run with libFuzzer's report, the Python traceback and the input
saved as ``crash-*`` (``-artifact_prefix=DIR/``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

import atheris

from tests.fuzz.common import HARNESSES


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in HARNESSES:
        sys.exit(f"usage: python -m tests.fuzz.runner {{{','.join(HARNESSES)}}} [libFuzzer args]")
    name = sys.argv[1]
    # Coverage is measured in Sluice's code; the harness and libraries are not instrumented.
    with atheris.instrument_imports(include=["sluice"]):
        module = importlib.import_module(f"tests.fuzz.fuzz_{name}")
    target: Callable[[bytes], None] = module.TestOneInput
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
