"""sluice_relay_thread_reads_total never goes down between scrapes.

The relay thread counts its reads while a scrape reads them: the compiled
reads and all reads are two numbers, read one after the other, and the
``python`` share is their difference. A read the relay thread counts in
between (or counts in all reads before it counts it as compiled) makes one
scrape's ``python`` too high and the next lower: Prometheus takes any drop
of a counter for a restart and counts the whole value again as an increase.
"""

from __future__ import annotations

from typing import Any

from sluice.proxy.metrics import RelayThreadFigures


class Counting:
    """A relay thread's counters as a scrape sees them while it runs: every
    read of ``compiled_runs`` lets ``runs`` more compiled reads happen before
    ``steps_run`` is read."""

    def __init__(self, runs: int) -> None:
        self.runs = runs
        self._compiled = 0
        self._steps = 0
        self.handed_back = self.write_waits = self.parked_ended = self.parked_adopted = 0

    @property
    def compiled_runs(self) -> int:
        seen = self._compiled
        self._compiled += self.runs  # the relay thread, meanwhile
        self._steps += self.runs
        return seen

    @property
    def steps_run(self) -> int:
        return self._steps

    def carried(self) -> int:
        return 0


def python_reads(figures: RelayThreadFigures) -> float:
    for family in figures.collect():
        if family.name == "sluice_relay_thread_reads":
            return float(next(s.value for s in family.samples if s.labels["path"] == "python"))
    raise AssertionError("no sluice_relay_thread_reads")


def test_python_reads_never_go_down_while_the_thread_counts() -> None:
    figures = RelayThreadFigures()
    thread: Any = Counting(runs=5)
    figures.thread = thread
    seen = [python_reads(figures)]
    thread.runs = 0  # the thread goes quiet: the true figure is 0 python reads
    seen.append(python_reads(figures))
    assert seen == sorted(seen), seen
