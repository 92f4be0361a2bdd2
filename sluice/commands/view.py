"""``sluice view CAPTURE``: read a capture in the browser.

Serves a page over the capture on loopback (``--listen``, default
127.0.0.1:8088; port 0 for any free one), or writes one self-contained
HTML file (``--export``) to attach to a bug report. ``--live ADMIN``
serves the same page over a running proxy's traffic instead
(``sluice.view.live``).
"""

from __future__ import annotations

import argparse
import http.client
import logging
import sys
import threading
import time
import urllib.parse
import urllib.request
import webbrowser
from pathlib import Path

from sluice.addresses import parse_address
from sluice.commands import output_problem
from sluice.commands.proxy import read_token
from sluice.config import count
from sluice.errors import ConfigError
from sluice.protocols import registry
from sluice.recording.format import Gone, RecordingError, Unfinished, read_records
from sluice.recording.reader import holds_nothing, listed
from sluice.recording.writer import private
from sluice.view.index import Filter, Index
from sluice.view.live import LiveIndex, live_url, watch
from sluice.view.server import ViewServer, export, serve

log = logging.getLogger("sluice.view")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "capture", type=Path, nargs="?", help="a recording file or a directory of them"
    )
    parser.add_argument(
        "--live",
        metavar="ADMIN",
        help="instead of a capture, watch a running proxy: its admin endpoint (HOST:PORT or "
        "URL, its --admin), with --admin-token-file (default: none, a capture is read)",
    )
    parser.add_argument(
        "--admin-token-file",
        type=Path,
        metavar="FILE",
        help="with --live: the proxy's admin token, which watching needs (default: none)",
    )
    parser.add_argument(
        "--save-dir",
        type=Path,
        default=Path(),
        metavar="DIR",
        help="with --live: where the page's save button writes captures (default: here)",
    )
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
        type=count,
        default=20_000,
        metavar="N",
        help="with --export: at most N frames (default: 20000); the file says what it left out",
    )
    parser.add_argument(
        "--details",
        type=count,
        default=2_000,
        metavar="N",
        help="with --export: the full detail of the first N of them (default: 2000)",
    )


def run(args: argparse.Namespace) -> int:
    if args.live is not None:
        return _live(args)
    if args.capture is None:
        print("sluice view: give a capture (a file or directory), or --live ADMIN",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        files = listed(args.capture)
        if not files:
            raise RecordingError(f"{args.capture}: no recordings (*.sluice) here")
        _check_something(args.capture, files)
        index = Index(args.capture)
        if args.export is not None:
            problem = output_problem(args.export, "--export", args.capture)
            if problem is not None:
                raise ConfigError(problem)
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
    return _until_interrupted(server, "", args.open)


def _check_something(target: Path, files: list[Path]) -> None:
    """Files none of which holds a whole record (each empty: its writer
    killed before the first flush; or cut inside its header) hold no
    recording: refused here, in one line (as replay does), not served as a
    page of nothing. Any other fault the page says. (Reads up to the first
    file that holds a record: one, as a rule.)"""
    skipped: list[Unfinished | Gone] = []
    for path in files:
        try:
            for _ in read_records(path):
                return  # a whole record: the page reads the rest
        except (Unfinished, Gone) as exc:
            if len(files) == 1:
                if isinstance(exc, Unfinished):
                    raise
                return  # the page says it
            skipped.append(exc)
        except RecordingError:
            return
    raise holds_nothing(target, skipped)


def _live(args: argparse.Namespace) -> int:
    def fail(message: str, status: int = 2) -> int:
        print(f"sluice view: {message}", file=sys.stderr)
        return status

    if args.capture is not None or args.export is not None:
        return fail("--live watches a proxy: give no capture and no --export")
    if args.admin_token_file is None:
        return fail("--live needs --admin-token-file: the proxy's admin token")
    try:
        _check_live(args.live)
        token = read_token(args.admin_token_file)
        address = parse_address(args.listen, what="--listen")
    except ConfigError as exc:
        return fail(str(exc))
    if token is None:
        return fail(f"--admin-token-file {args.admin_token_file}: empty")
    if not args.save_dir.is_dir():
        return fail(f"--save-dir {args.save_dir}: no such directory")
    url = live_url(args.live)
    index = LiveIndex(args.live)
    registry.prepare_reading()
    try:
        server = serve(index, address.host, address.port, build=False, save_dir=args.save_dir)
    except OSError as exc:
        return fail(f"cannot listen on {address}: {exc.strerror or exc}", 1)
    stop = threading.Event()
    threading.Thread(target=watch, args=(index, url, token, stop), name="view-live",
                     daemon=True).start()  # fmt: skip
    return _until_interrupted(server, f" watching {url}", args.open, stop)


def _check_live(text: str) -> None:
    """``--live``: an admin endpoint as HOST:PORT or an http(s) URL; a
    ConfigError, before anything listens, for anything else (the watching
    would otherwise fail on the page only, the command line saying nothing)."""
    if "://" not in text:
        parse_address(text, what="--live")
        return
    parts = urllib.parse.urlsplit(text)
    try:
        parts.port  # noqa: B018 (a port that is not one raises)
    except ValueError:
        parts = parts._replace(scheme="")
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError(f"--live {text!r}: expected HOST:PORT or http://HOST:PORT, the "
                          "proxy's --admin")  # fmt: skip
    try:  # what the watcher's requests will make of it (a host urllib unquotes, say)
        http.client.HTTPConnection(urllib.request.Request(live_url(text)).host)
    except (http.client.HTTPException, ValueError) as exc:
        raise ConfigError(f"--live {text!r}: {exc}") from None


def _until_interrupted(
    server: ViewServer, what: str, open_page: bool, stop: threading.Event | None = None
) -> int:
    """Say where the page is (and ``what`` it shows), open it if asked, and
    serve until Ctrl-C."""
    host, port = str(server.server_address[0]), int(server.server_address[1])
    page = f"http://{host}:{port}/"
    print(f"sluice view: {page}{what}  (Ctrl-C to stop)", flush=True)
    if open_page:
        threading.Thread(target=webbrowser.open, args=(page,), daemon=True).start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        if stop is not None:
            stop.set()
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
    if args.max_frames < 1:  # a file of no frame is no export: one was written, and 0 said
        print("sluice view: --max-frames must be at least 1", file=sys.stderr)
        return 2
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
    html = export(index, chosen, args.max_frames, args.details)
    try:
        with open(args.export, "w", opener=private) as handle:
            handle.write(html)
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
