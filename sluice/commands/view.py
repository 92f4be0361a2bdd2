"""``sluice view CAPTURE``: read a capture in the browser.

Serves a page over the capture on loopback (``--listen``, default
127.0.0.1:8088; port 0 for any free one), or writes one self-contained
HTML file (``--export``) to attach to a bug report.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
import urllib.parse
import webbrowser
from pathlib import Path

from sluice.addresses import parse_address
from sluice.errors import ConfigError
from sluice.protocols import registry
from sluice.recording.format import RecordingError, recording_files
from sluice.view.index import Filter, Index
from sluice.view.server import export, serve

log = logging.getLogger("sluice.view")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("capture", type=Path, help="a recording file or a directory of them")
    parser.add_argument(
        "--listen",
        default="127.0.0.1:8088",
        metavar="HOST:PORT",
        help="where to serve the page (default: 127.0.0.1:8088; port 0: any free port)",
    )
    parser.add_argument("--open", action="store_true", help="open the page in a browser")
    parser.add_argument(
        "--export",
        type=Path,
        metavar="FILE.html",
        help="write one self-contained HTML file instead of serving (default: serve)",
    )
    parser.add_argument(
        "--filter",
        metavar="QUERY",
        default="",
        help="with --export: only frames matching, as in the page's link, e.g. "
        "'topic=orders&problems=1' (default: all)",
    )
    parser.add_argument(
        "--max-frames",
        type=int,
        default=20_000,
        metavar="N",
        help="with --export: at most N frames (default: 20000); the file says what it left out",
    )
    parser.add_argument(
        "--details",
        type=int,
        default=2_000,
        metavar="N",
        help="with --export: the full detail of the first N of them (default: 2000)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        if not recording_files(args.capture):
            raise RecordingError(f"{args.capture}: no recordings (*.sluice) here")
        index = Index(args.capture)
        if args.export is not None:
            return _export(index, args)
        address = parse_address(args.listen, what="--listen")
    except (RecordingError, ConfigError) as exc:
        print(f"sluice view: {exc}", file=sys.stderr)
        return 2
    index.on_built = _report
    registry.prepare_reading()  # before the index is built in a thread, pages served
    try:
        server = serve(index, address.host, address.port)
    except OSError as exc:
        print(f"sluice view: cannot listen on {address}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    host, port = str(server.server_address[0]), int(server.server_address[1])
    url = f"http://{host}:{port}/"
    print(f"sluice view: {url}  (Ctrl-C to stop)", flush=True)
    if args.open:
        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()

    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def _report(index: Index) -> None:
    """Say on the command line, too, what the page says is wrong, once read."""
    for problem in ([index.error] if index.error else []) + index.truncated:
        print(f"sluice view: {problem}", file=sys.stderr, flush=True)
    if not index.error:
        print(f"sluice view: {index.frames} frames on {len(index.connections)} connections "
              f"read in {index.built_in:.1f} s", file=sys.stderr, flush=True)  # fmt: skip


def _export(index: Index, args: argparse.Namespace) -> int:
    query = {k: v[-1] for k, v in urllib.parse.parse_qs(args.filter.lstrip("#?")).items()}
    try:
        chosen = Filter.from_query(query)
    except ValueError as exc:
        print(f"sluice view: --filter: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    print(f"sluice view: reading {args.capture} …", file=sys.stderr, flush=True)
    index.build()
    if index.error:
        print(f"sluice view: {index.error}", file=sys.stderr)
        return 2
    html = export(index, chosen, max(1, args.max_frames), max(0, args.details))
    try:
        args.export.write_text(html)
    except OSError as exc:
        print(f"sluice view: {args.export}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    total = sum(1 for _ in index.matching(chosen))
    kept = min(total, args.max_frames)
    elapsed = time.monotonic() - started
    print(
        f"sluice view: wrote {args.export}: {kept} of {total} matching frames "
        f"({index.frames} in the capture), in {elapsed:.1f} s",
        file=sys.stderr,
    )
    return 0
