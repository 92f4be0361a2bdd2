"""Log output: readable lines by default, JSON lines for log shippers.

Every line about a connection starts with its name (``conn-7 10.1.2.3:5123:``);
the JSON form also puts the id in its own field, ``conn``. Credentials are
never logged: frame bodies pass through the protocol's redaction first
(``sluice.protocols.pulsar.redact.loggable``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import re
import sys
import time

_CONN = re.compile(r"^conn-(\d+)\b")

# The most of a value from outside (a client's algorithm name, auth method,
# URL) that one log line or error message shows.
CLIP = 64


def clipped(value: str | bytes, limit: int = CLIP) -> str:
    """``value``, which came from outside, as one line of a log: its repr
    (control characters escaped) with at most ``limit`` characters of it
    shown and the number left out said, so that a client cannot write 16 KiB
    (or a forged line) into the log per connection."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value) - limit} more)"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, object] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": message,
        }
        worker = getattr(record, "worker", None)
        if worker is not None:
            out["worker"] = worker
        match = _CONN.match(message)
        if match:
            out["conn"] = int(match[1])
        if record.exc_info and record.levelno >= logging.ERROR:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class TextFormatter(logging.Formatter):
    """logging's own text form, its timestamp's date and time worked out
    once a second (``time.localtime`` and ``strftime`` were a third of what
    a line cost)."""

    def __init__(self, fmt: str) -> None:
        super().__init__(fmt)
        self._second = -1
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(second))
            self._second = second
        return f"{self._stamp},{int(record.msecs):03d}"


class _WorkerTag(logging.Filter):
    def __init__(self, worker: int) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.worker
        return True


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="least severe messages shown",
    )
    group.add_argument(
        "--log-format", default="text", choices=("text", "json"), help="json: one object per line"
    )


def setup_logging(level: str, form: str = "text", *, worker: int | None = None) -> None:
    """Log to stderr; ``worker``: a worker process of ``--workers N``, whose
    lines say which one it is (``w2`` in text, ``"worker": 2`` in JSON)."""
    handler = logging.StreamHandler(sys.stderr)
    if form == "json":
        handler.setFormatter(JsonFormatter())
    else:
        tag = f"w{worker} " if worker is not None else ""
        line = f"%(asctime)s %(levelname)-7s {tag}%(name)s: %(message)s"
        handler.setFormatter(TextFormatter(line))
    if worker is not None:
        handler.addFilter(_WorkerTag(worker))
    # No line shows where in the code it was logged, nor the thread or
    # process: not looking them up (the logging HOWTO's "Optimization")
    # halves what a line costs, and the proxy writes one per connection.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))


class LogLimit:
    """One warning per key per ``interval`` seconds (on the caller's clock),
    and at most ``burst`` in all per interval; the rest at debug. What anyone
    may repeat without credentials must not flood the log. Remembers at most
    ``keys`` keys, forgetting the oldest."""

    def __init__(self, interval: float = 60.0, burst: int = 20, keys: int = 1_024) -> None:
        self.interval = interval
        self.burst = burst
        self.keys = keys
        self._last: dict[object, float] = {}
        self._window = -interval
        self._count = 0

    def level(self, key: object, now: float) -> int:
        """The level to log ``key``'s line at, now."""
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            return logging.DEBUG
        if now - self._window >= self.interval:
            self._window, self._count = now, 0
        if self._count >= self.burst:
            return logging.DEBUG
        self._count += 1
        self._last.pop(key, None)
        if len(self._last) >= self.keys:
            del self._last[next(iter(self._last))]
        self._last[key] = now
        return logging.WARNING
