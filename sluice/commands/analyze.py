"""``sluice analyze``: many recordings in, Parquet tables and a report out.

    sluice analyze PATH... --out DIR [--master URL | --remote sc://HOST:PORT] [--quiet]
    spark-submit sluice/commands/analyze.py PATH... --out DIR      # same job

The job itself is ``sluice/analyze/job.py``; this module is its options,
its checks and its output, and the ``spark-submit`` entry point.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from sluice.analyze.job import NoRecordings, Unreachable, analyze
from sluice.analyze.jvm import spark_java
from sluice.commands import output_problem


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
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--master",
        metavar="URL",
        help="Spark master (default: local[*], or what spark-submit says)",
    )
    where.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="run the job through Spark Connect at this URL; PATH and --out are then as the "
        "server sees them (default: off, Spark runs in this process)",
    )
    parser.add_argument(
        "--report",
        metavar="FILE",
        help="where report.html goes (default: in DIR when DIR is a directory here, else "
        "./report.html)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress line and no stage lines; errors and the last two lines still show "
        "(the progress line shows only where stderr is a terminal)",
    )


# The master URLs Spark takes (SparkContext's own forms, and spark-submit's
# ``yarn`` and ``k8s://``): any other is refused by Spark only once its JVM
# has started, with a Java stack trace and a line that does not name it.
_HOST_PORT = r"(\[[0-9A-Fa-f:.]+\]|[^,/:@?#\s\[\]]+):\d+"
_MASTER = re.compile(
    r"local(\[(\d+|\*)(\s*,\s*\d+)?\])?"
    r"|local-cluster\[\s*\d+\s*,\s*\d+\s*,\s*\d+\s*\]"
    rf"|spark://{_HOST_PORT}(,{_HOST_PORT})*|yarn|k8s://\S+"
)


def master_problem(master: str | None) -> str | None:
    """Why ``--master`` is not a master URL Spark takes, in one line; None
    when it is one (or not given)."""
    if master is None or _MASTER.fullmatch(master):
        return None
    return (
        f"--master {master!r}: not a Spark master URL (local, local[N], local[*], "
        "spark://HOST:PORT, yarn, k8s://URL)"
    )


def java_problem(env: Mapping[str, str]) -> str | None:
    """Why a local Spark cannot start its JVM, in one line: no ``java``
    where PySpark's launcher looks (``$JAVA_HOME/bin/java``, else ``java``
    on PATH); None when there is one, or under ``spark-submit`` (its JVM
    runs already)."""
    if "PYSPARK_GATEWAY_PORT" in env or spark_java(env) is not None:
        return None
    home = env.get("JAVA_HOME")
    if home:
        return f"a local Spark needs Java 17 or later: JAVA_HOME is {home}, which has no bin/java"
    return (
        "a local Spark needs Java 17 or later: no java on PATH and JAVA_HOME is not set "
        "(or give --remote sc://HOST:PORT: the server runs Spark)"
    )


def _spark_path(path: str) -> str:
    """Local paths (``run-12:30`` too) as plain absolute paths, URLs
    (``file:/x``, ``s3a://b/k``) unchanged.

    Not as ``file://`` URLs: Spark (Hadoop's ``Path``) does not URL-decode a
    path, so a ``%20`` or ``%23`` in one names another file than the one
    with a space or ``#`` meant."""
    from sluice.analyze.decode import is_url

    return path if is_url(path) else str(Path(path).resolve())


def _exists(local: str | None) -> bool:
    """Whether a local PATH is there (a URL of another scheme: Spark will
    say); one in a directory that may not be entered is (``_unreadable`` says so)."""
    if local is None:
        return True
    try:
        os.stat(local)
    except PermissionError:
        return True
    except (OSError, ValueError):
        return False
    return True


def _unreadable(local: str | None) -> str | None:
    """A local PATH, or a folder in it, that this user may not read, said
    as the other readers say it (``reader.listed``), before Spark starts:
    Spark's own listing passes over a folder it cannot list."""
    from sluice.recording.format import RecordingError
    from sluice.recording.reader import listed

    if local is None:
        return None
    try:
        listed(Path(local))
    except RecordingError as exc:
        return str(exc)
    return None


def _holds_nothing(paths: list[str], local: list[str]) -> str | None:
    """Why inputs none of whose files holds a whole record (each empty, its
    writer killed before the first flush, or cut inside its header) are no
    recording, said as inspect, view and replay say it, before Spark
    starts (which would count each as a truncated, bad segment); None when
    one holds a record, or cannot be read here (Spark says). Reads up to
    the first file that holds a record: one, as a rule."""
    from sluice.recording.format import Gone, RecordingError, Unfinished, read_records
    from sluice.recording.reader import holds_nothing, listed

    files = [file for path in local for file in listed(Path(path))]
    skipped: list[Unfinished | Gone] = []
    for file in files:
        try:
            for _ in read_records(file):
                return None  # a whole record: the job reads the rest
        except (Unfinished, Gone) as exc:
            if len(files) == 1:
                return str(exc) if isinstance(exc, Unfinished) else None
            skipped.append(exc)
        except RecordingError:
            return None  # damaged: the job says so
    if not skipped:
        return None  # no recordings at all: the job says so
    return str(holds_nothing(Path(", ".join(paths)), skipped))


def _links_to_nothing(folder: str | None) -> list[str]:
    """The ``*.sluice`` links under a local folder that lead nowhere (Spark
    skips them without a word)."""
    if folder is None or not os.path.isdir(folder):
        return []
    found = []
    for where, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(where, name)
            if name.endswith(".sluice") and os.path.islink(path) and not os.path.exists(path):
                found.append(path)
    return sorted(found)


def _out_problem(out: str, local: str | None) -> str | None:
    """Why a local ``--out`` cannot take the tables, in one line, said
    before Spark starts (which would fail on it only after the work): the
    nearest folder of it that is there must be a folder this user may
    write in. Nothing is made here (a run with nothing to read leaves no
    ``--out`` behind). An empty one (an unset variable, quoted) is not the
    folder the command runs in."""
    if not out.strip():
        return f"--out {out!r}: an empty path (give the folder for the tables)"
    if local is None:
        return None
    there = os.path.abspath(local)
    while not os.path.lexists(there) and os.path.dirname(there) != there:
        there = os.path.dirname(there)
    if not os.path.isdir(there):
        return f"--out {out}: cannot be made ({os.strerror(errno.ENOTDIR)}: {there})"
    if not os.access(there, os.W_OK | os.X_OK):
        return f"--out {out}: cannot be written ({os.strerror(errno.EACCES)}: {there})"
    return None


def report_problem(report: str, paths: list[str]) -> str | None:
    """Why ``--report`` cannot take the report, in one line (``output_problem``),
    checked against every local PATH: written over after the analysis,
    a recording of any of them would be lost."""
    from sluice.analyze.decode import local_path

    reading = [Path(local) for local in map(local_path, paths) if local is not None]
    for source in reading or [Path(paths[0])]:
        problem = output_problem(Path(report), "--report", source)
        if problem is not None:
            return problem
    return None


# What a table's folder holds after a run, whole or cut short: Spark's
# writer's parts, their checksums and markers, or the executors' parts
# (``partials.frames_file``) and their temporary names.
_TABLE_FILE = re.compile(
    r"(\.?part-[\w.-]+(\.crc)?|\.?_SUCCESS(\.crc)?|_temporary|_committed_\w+|_started_\w+)"
)


def _not_tables(local: str | None) -> str | None:
    """Why a local ``--out`` must not take the tables, in one line: a
    folder (or file) in it named like a table that holds something else,
    which replacing the table would remove with all it holds (``--out .``).
    An earlier run's tables are replaced; None for them, or a URL."""
    from sluice.analyze.job import TABLES

    if not local:
        return None
    for name in TABLES:
        where = os.path.join(local, name)
        if not os.path.lexists(where):
            continue
        if not os.path.isdir(where) or os.path.islink(where):
            what = "a link" if os.path.islink(where) else "a file"
            return (
                f"--out {local}: {where} is {what}, not a table of an earlier run: "
                "give another --out"
            )
        try:
            others = sorted(n for n in os.listdir(where) if not _TABLE_FILE.fullmatch(n))
        except OSError as exc:
            return f"--out {local}: {where}: {exc.strerror or exc}"
        if others:
            shown = ", ".join(others[:3]) + (", …" if len(others) > 3 else "")
            return (
                f"--out {local}: {where} holds files that are no table of an earlier run "
                f"({shown}): give another --out"
            )
    return None


def failure(exc: BaseException) -> str:
    """A failed job's error in one line.

    An executor's (a Python worker's) says first only that there was one,
    then its traceback: its last line is the error itself, a segment's path
    first where one was being reduced (``partials.SegmentFailed``)."""
    from pyspark.errors import PythonException

    text = str(exc).strip()
    if not text:
        return repr(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not isinstance(exc, PythonException):
        # A JVM error through Py4J says first which call it was ("An error
        # occurred while calling o185.parquet."), then ": CLASS: MESSAGE".
        java = re.match(r": ([\w.$]+)(?:: (.*))?$", lines[1]) if len(lines) > 1 else None
        if lines[0].startswith("An error occurred while calling") and java:
            return java.group(2) or java.group(1).rpartition(".")[2]
        return lines[0]
    last = lines[-1]
    said = re.match(r"(?:[\w.]+\.)?SegmentFailed: (.*)", last)
    return said.group(1) if said else last


def run(args: argparse.Namespace) -> int:
    from sluice.extras import need_extra

    if not need_extra("analyze", "pipeline"):
        return 2
    from sluice.analyze.decode import local_path
    from sluice.analyze.progress import Progress
    from sluice.analyze.report import write_report

    if args.remote is not None and not args.remote.startswith("sc://"):
        print(f"sluice analyze: --remote wants an sc://HOST:PORT URL, not {args.remote!r}",
              file=sys.stderr)  # fmt: skip
        return 2
    problem = master_problem(args.master)
    if problem is not None:
        print(f"sluice analyze: {problem}", file=sys.stderr)
        return 2
    progress = Progress() if sys.stderr.isatty() and not args.quiet else None

    def say(text: str, always: bool = False) -> None:
        if args.quiet and not always:
            return
        if progress is not None:
            progress.clear()
        print(f"[analyze] {text}", file=sys.stderr, flush=True)

    local = args.remote is None  # through Spark Connect, paths are the server's
    missing = [p for p in args.paths if local and not _exists(local_path(p))]
    if missing:
        print(f"sluice analyze: no such file or directory: {missing[0]}", file=sys.stderr)
        return 2
    for path in args.paths if local else ():
        problem = _unreadable(local_path(path))
        if problem is not None:
            print(f"sluice analyze: {problem}", file=sys.stderr)
            return 2
    locals_ = [local_path(p) for p in args.paths] if local else []
    if locals_ and all(p is not None for p in locals_):  # (a URL's files are Spark's to list)
        problem = _holds_nothing(args.paths, [p for p in locals_ if p is not None])
        if problem is not None:
            print(f"sluice analyze: {problem}", file=sys.stderr)
            return 2
    for path in args.paths if local else ():
        for link in _links_to_nothing(local_path(path)):
            print(f"sluice analyze: {link}: a link to nothing, skipped", file=sys.stderr)
    if args.report:  # said now, not after the Spark run
        problem = report_problem(args.report, args.paths)
        if problem is not None:
            print(f"sluice analyze: {problem}", file=sys.stderr)
            return 2
    out = args.out
    local_out = local_path(out) if local else None
    if local_out and os.path.exists(local_out) and not os.path.isdir(local_out):
        print(f"sluice analyze: --out {out}: not a directory (the tables are a folder)",
              file=sys.stderr)  # fmt: skip
        return 2
    problem = _out_problem(out, local_out) or _not_tables(local_out)
    if problem is not None:
        print(f"sluice analyze: {problem}", file=sys.stderr)
        return 2
    problem = java_problem(os.environ) if args.remote is None else None
    if problem is not None:
        print(f"sluice analyze: {problem}", file=sys.stderr)
        return 2
    paths = [_spark_path(p) for p in args.paths]
    try:
        summary = analyze(paths, _spark_path(out), args.master, say, args.remote, progress)
    except Unreachable as exc:
        print(f"sluice analyze: {exc}", file=sys.stderr)
        return 2
    except NoRecordings:
        print(f"sluice analyze: {', '.join(args.paths)}: no recordings (*.sluice) here",
              file=sys.stderr)  # fmt: skip
        return 2
    except Exception as exc:
        print(f"sluice analyze: {failure(exc)}", file=sys.stderr)
        return 1
    local_out = local_path(out)  # the report goes beside the tables, wherever they are
    if args.report:
        report = Path(args.report)
    elif local_out is not None and Path(local_out).is_dir():
        report = Path(local_out) / "report.html"
    else:
        report = Path("report.html")
    try:
        write_report(summary, report)
    except OSError as exc:
        print(f"sluice analyze: {report}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    say(f"wrote report: {report}", always=True)
    say(
        f"{summary['frames']} frames, {summary['connections']} connections, "
        f"{summary['http']['exchanges']} HTTP exchanges from "
        f"{summary['files']} files ({len(summary['damaged'])} damaged, "
        f"{len(summary['truncated'])} truncated, {summary['dropped_frames']} frames dropped "
        f"while recording) in {summary['seconds']:.1f} s",
        always=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
