"""The progress line of ``sluice analyze``: what it is doing, tasks done, bytes read.

One line on stderr, rewritten in place at most twice a second while the job
runs, cleared when it ends::

    [analyze] decoding and reducing the segments: stage 2, 7/11 tasks, 650.1 MB read, 6.4 s

Where it comes from:

- a local Spark or a cluster (this process is the driver): the driver's own
  status store, polled from a thread (active stages: tasks done of total;
  bytes its readers read), and, where the executors read the segments
  themselves (``job.py``), an accumulator they add each segment's size to;
- Spark Connect: the progress the server reports with each answer
  (``SparkSession.registerProgressHandler``: stages, tasks, bytes read).

Shown only where someone watches: stderr a terminal and no ``--quiet``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any, TextIO

INTERVAL = 0.5  # seconds between two redraws at most
POLL = 0.2  # seconds between two looks at the driver's status store


class Progress:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self.doing = "starting Spark"
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._stage: tuple[int, int, int] | None = None  # (id, done, total) of the busiest
        self._bytes_by_stage: dict[int, int] = {}
        self._accumulator: Any = None
        self._shown = 0  # width of the line on screen
        self._last = 0.0

    # What the job tells it.

    def now(self, doing: str) -> None:
        with self._lock:
            self.doing = doing
        self._draw(force=True)

    def accumulator(self, spark: Any) -> Any:
        """An accumulator of bytes read by the executors (classic Spark only)."""
        if self._thread is None:  # Spark Connect: no accumulators, Spark reads
            return None
        self._accumulator = spark.sparkContext.accumulator(0)
        return self._accumulator

    # Where the numbers come from.

    def watch(self, spark: Any) -> None:
        if hasattr(spark, "registerProgressHandler") and not hasattr(spark, "_jsc"):
            spark.registerProgressHandler(self._connect_progress)
            return
        store = spark.sparkContext._jsc.sc().statusStore()
        self._thread = threading.Thread(target=self._poll, args=(store,), daemon=True)
        self._thread.start()

    def _poll(self, store: Any) -> None:
        while not self._stopped.wait(POLL):
            with contextlib.suppress(Exception):  # the JVM going away at the end
                active = store.activeStages()
                stages = [active.apply(i) for i in range(active.size())]
                self._update(
                    [
                        (s.stageId(), s.numCompleteTasks(), s.numTasks(), s.inputBytes())
                        for s in stages
                    ]
                )

    def _connect_progress(
        self, stages: Any = None, inflight_tasks: int = 0, operation_id: Any = None,
        done: bool = False, **_: Any,
    ) -> None:  # fmt: skip
        self._update(
            [
                (s.stage_id, s.num_completed_tasks, s.num_tasks, s.num_bytes_read)
                for s in stages or ()
                if not s.done
            ]
        )

    def _update(self, stages: list[tuple[int, int, int, int]]) -> None:
        with self._lock:
            for stage, _, _, read in stages:
                self._bytes_by_stage[stage] = max(read, self._bytes_by_stage.get(stage, 0))
            busiest = max(stages, key=lambda s: s[2] - s[1], default=None)
            self._stage = busiest[:3] if busiest else None
        self._draw()

    # The line.

    def line(self) -> str:
        with self._lock:
            read = sum(self._bytes_by_stage.values())
            if self._accumulator is not None:
                read += int(self._accumulator.value)
            parts = [f"[analyze] {self.doing}"]
            if self._stage is not None:
                stage, done, total = self._stage
                parts.append(f"stage {stage}, {done}/{total} tasks")
            parts.append(f"{_size(read)} read")
            parts.append(f"{time.monotonic() - self.started:.1f} s")
        return ": ".join(parts[:2]) + (", " + ", ".join(parts[2:]) if len(parts) > 2 else "")

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._stopped.is_set() or (not force and now - self._last < INTERVAL):
            return
        self._last = now
        text = self.line()
        with self._lock:
            pad = max(0, self._shown - len(text))
            self._shown = len(text)
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()

    def clear(self) -> None:
        """Take the line off the screen (before another line is printed)."""
        with self._lock:
            if self._shown:
                self.stream.write("\r" + " " * self._shown + "\r")
                self.stream.flush()
                self._shown = 0

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(2 * INTERVAL)
        self.clear()


def _size(count: int) -> str:
    return f"{count / 1e6:,.1f} MB" if count >= 1e6 else f"{count / 1e3:,.1f} kB"
