"""Fixed recordings for ``sluice analyze`` and the tables it made of them.

    python tests/golden/capture_analyze.py [--tables-only]

Records the traffic of ``tests/test_analyze.py`` twice through ``sluice
proxy`` in front of the embedded broker (two captures), keeps the first
whole (in segments of 4 KiB), cuts the second mid-record (a truncated segment) and adds a file that
was never a recording; these go to ``analyze/inputs/``. Then runs ``sluice
analyze`` on them and stores every table, rows sorted, in
``analyze/tables.json``: what a change to the pipeline must reproduce row for
row (``tests/test_analyze.py``). ``--tables-only`` keeps the inputs and
writes the tables again (only when a change of the tables is intended).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent / "analyze"
sys.path.insert(0, str(HERE.parent.parent.parent))

from sluice.brokers.embedded import EmbeddedBroker  # noqa: E402
from sluice.recording.format import recording_files  # noqa: E402
from tests.test_analyze import analyze, golden_tables, record  # noqa: E402


def capture(inputs: Path) -> None:
    shutil.rmtree(inputs, ignore_errors=True)
    inputs.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        # Small segments: requests answered in the next segment, connections
        # re-stated at the start of each.
        clean = record(broker, Path(tmp), "a", "--record-max-bytes", "4096")
        other = record(broker, Path(tmp), "b")
        for path in recording_files(clean):
            shutil.copy(path, inputs / path.name)
        [cut] = recording_files(other)
        data = cut.read_bytes()
        (inputs / cut.name).write_bytes(data[: int(len(data) * 0.6)])
        manifest = {"clean": sorted(p.name for p in recording_files(clean)), "truncated": cut.name}
    (inputs / "garbage.sluice").write_bytes(b"\x00\x01 this was never a recording \xc1" * 10)
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables-only", action="store_true")
    args = parser.parse_args()
    inputs = HERE / "inputs"
    if not args.tables_only:
        capture(inputs)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        analyze(inputs.as_uri(), out, "local[2]")
        tables = golden_tables(out)
    (HERE / "tables.json").write_text(json.dumps(tables, indent=0, sort_keys=True) + "\n")
    print(f"wrote {HERE / 'tables.json'}: " + ", ".join(f"{n} {len(r)}" for n, r in tables.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
