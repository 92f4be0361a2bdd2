"""Log lines (sluice/logs.py): the text form, its timestamp worked out once
a second, reads exactly as logging's own formatter writes it."""

from __future__ import annotations

import logging
import random

from sluice.logs import TextFormatter

LINE = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def test_text_lines_read_as_loggings_own_formatter_writes_them() -> None:
    ours, theirs = TextFormatter(LINE), logging.Formatter(LINE)
    rng = random.Random(7)
    start = 1_795_000_000.0  # 2026-11-18
    # Within a second, across seconds, back in time (a clock set back),
    # and at the edges of a millisecond and of a second.
    times = [start + rng.uniform(0, 3) for _ in range(500)]
    times += [start + 5.0, start + 5.999999, start + 4.0005, start + 86_400 * 40 + 0.001]
    for created in times:
        record = logging.LogRecord("sluice.relay", logging.INFO, "", 0, "conn-%d up", (7,), None)
        record.created = created
        record.msecs = int((created - int(created)) * 1000) + 0.0
        assert ours.format(record) == theirs.format(record)
