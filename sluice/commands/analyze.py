"""``sluice analyze``: many recordings in, Parquet tables and a report out.

    sluice analyze PATH... --out DIR [--master URL]
    spark-submit sluice/commands/analyze.py PATH... --out DIR      # same job

The job itself is ``sluice/analyze/job.py``; this module is its options,
its checks and its output, and the ``spark-submit`` entry point.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sluice.analyze.job import analyze


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sluice analyze", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="recording files or directories (local, or any URL Spark reads: file://, s3a://, "
        "hdfs://, gs://)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="where tables and report go; required, no default",
    )
    parser.add_argument(
        "--master",
        metavar="URL",
        help="Spark master (default: local[*], or what spark-submit says)",
    )


def _spark_path(path: str) -> str:
    """Local paths as absolute file:// URLs; anything with a scheme unchanged."""
    return path if "://" in path else Path(path).resolve().as_uri()


def run(args: argparse.Namespace) -> int:
    from sluice.extras import need_extra

    if not need_extra("analyze", "pipeline"):
        return 2
    from sluice.analyze.report import write_report

    def say(text: str) -> None:
        print(f"[analyze] {text}", file=sys.stderr, flush=True)

    missing = [p for p in args.paths if "://" not in p and not Path(p).exists()]
    if missing:
        print(f"sluice analyze: no such file or directory: {missing[0]}", file=sys.stderr)
        return 2
    out = args.out
    try:
        summary = analyze([_spark_path(p) for p in args.paths], _spark_path(out), args.master, say)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        print(f"sluice analyze: {first}", file=sys.stderr)
        return 1
    local_out = out.removeprefix("file://") if out.startswith("file://") else out
    if "://" not in local_out:
        write_report(summary, Path(local_out) / "report.html")
        say(f"wrote report: {Path(local_out) / 'report.html'}")
    say(
        f"{summary['frames']} frames, {summary['connections']} connections, "
        f"{summary['http']['exchanges']} HTTP exchanges from "
        f"{summary['files']} files ({len(summary['damaged'])} damaged, "
        f"{len(summary['truncated'])} truncated) in {summary['seconds']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
