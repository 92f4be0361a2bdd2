"""The long fuzz run (#40): every harness of tests/fuzz/ under atheris.

    python bench/fuzz.py [--minutes 10] [--runs N] [--only NAME,...] [--keep DIR] [--seed N]

Each harness (tests/fuzz/fuzz_*.py: the Pulsar decoder, Pulsar payloads,
the Cursus codec, the proxy-mode core) gets an equal share of --minutes
(default 10 minutes in all), or --runs executions each, starting from its
seed corpus (tests/fuzz/corpus/<name>/, never written). A harness that
finds a bug is started again for the rest of its share, so one finding
does not end the search; the inputs it kept are its corpus again. Prints,
per harness: executions, executions per second, coverage (libFuzzer's
edges and features of Sluice's instrumented code), the corpus it grew
(inputs), and each distinct finding with its traceback's last line and the
input's path. Exits 1 when anything was found. Inputs, grown corpora and
findings go to --keep DIR (default: a temporary directory, removed unless
something was found).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz.common import HARNESSES
from tests.fuzz.runner import Run, fuzz


@dataclass
class Tally:
    harness: str
    executions: int = 0
    seconds: float = 0.0
    coverage: int = 0
    features: int = 0
    corpus: int = 0
    starts: int = 0
    findings: dict[str, Path | None] = field(default_factory=dict)  # last line -> input

    def add(self, run: Run) -> None:
        self.starts += 1
        self.executions += run.executions
        self.seconds += run.seconds
        self.coverage = max(self.coverage, run.coverage)
        self.features = max(self.features, run.features)
        self.corpus = max(self.corpus, run.corpus)
        if run.failure is not None:
            last = run.failure.strip().splitlines()[0][:160]
            self.findings.setdefault(last, run.artifact)


def run_harness(harness: str, scratch: Path, args: argparse.Namespace, share: float) -> Tally:
    tally = Tally(harness)
    deadline = time.monotonic() + share
    while True:
        left = deadline - time.monotonic()
        if args.runs is None and left < 5:
            break
        run = fuzz(
            harness,
            scratch,
            runs=None if args.runs is None else args.runs - tally.executions,
            seconds=None if args.runs is not None else left,
            seed=None if args.seed is None else args.seed + tally.starts,
            timeout=(left if args.runs is None else 3600) + 120,
        )
        tally.add(run)
        if run.failure is not None:
            print(f"  {harness}: found after {run.executions:,} executions: {run.failure}")
        if run.failure is None or (args.runs is not None and tally.executions >= args.runs):
            break
        if tally.starts >= 20:  # the same findings again and again: enough
            break
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--minutes", type=float, default=10.0,
        help="wall time for all harnesses together (default 10 minutes)")  # fmt: skip
    add("--runs", type=int, default=None,
        help="executions per harness instead of a time (default: by time)")  # fmt: skip
    add("--only", default=",".join(HARNESSES),
        help=f"harnesses, comma-separated (default: all: {','.join(HARNESSES)})")  # fmt: skip
    add("--keep", type=Path, default=None,
        help="keep grown corpora and findings here (default: a temporary directory)")  # fmt: skip
    add("--seed", type=int, default=None,
        help="libFuzzer's random seed (default: a new one each run)")  # fmt: skip
    args, _ = parser.parse_known_args()  # ./dev bench hands every bench the same arguments
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(HARNESSES))
    if unknown:
        parser.error(f"unknown harness {', '.join(unknown)} (known: {', '.join(HARNESSES)})")
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="sluice-fuzz-"))
    scratch.mkdir(parents=True, exist_ok=True)
    share = args.minutes * 60 / len(names)
    how = f"{args.runs:,} executions each" if args.runs else f"{share:.0f} s each"
    print(f"fuzzing {', '.join(names)}: {how}; corpora and findings in {scratch}")
    tallies = [run_harness(name, scratch, args, share) for name in names]
    print()
    print(f"{'harness':<16} {'executions':>11} {'exec/s':>7} {'cov':>5} {'ft':>6} "
          f"{'corpus':>6} findings")  # fmt: skip
    for t in tallies:
        rate = t.executions / t.seconds if t.seconds else 0.0
        print(f"{t.harness:<16} {t.executions:>11,} {rate:>7,.0f} {t.coverage:>5} "
              f"{t.features:>6} {t.corpus:>6} {len(t.findings)}")  # fmt: skip
    total = sum(t.executions for t in tallies)
    found = [(t.harness, last, path) for t in tallies for last, path in t.findings.items()]
    print(f"{'all':<16} {total:>11,}{'':>35}{len(found)}")
    for harness, last, path in found:
        print(f"  {harness}: {last}\n    input: {path}")
    if found:
        print(f"inputs kept in {scratch}: add each to tests/fuzz/crashes/<harness>/ with a test")
        return 1
    if args.keep is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
