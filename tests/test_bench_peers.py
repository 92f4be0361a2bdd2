"""bench/peers.py's rules on figures given to them (the warm-up's stop
condition, the "vs peer" columns' spread), and the live path's watcher,
which must say when nobody is watching (one test beside a real `sluice
proxy`, no broker)."""

from __future__ import annotations

import argparse
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.peers import (
    ADMIN,
    WARM_LOADS,
    WARM_PASSES,
    Cell,
    Figures,
    Watcher,
    Workload,
    table,
    warm_up,
    workloads,
)
from sluice.brokers.embedded import free_port
from tests.helpers.support import start_proxy


def scripted(cpus: dict[str, list[float | None]]) -> tuple[list[Workload], Callable[[str], str]]:
    """WARM_LOADS whose pass N through path P reads ``cpus[P][N - 1]`` µs/msg
    (the same on both loads); ``run_of`` hands the path's name to the load."""
    passes: dict[tuple[str, str], Iterator[float | None]] = {}

    def load(name: str) -> Callable[[Any], Figures]:
        def run(path: Any) -> Figures:  # run_of's answer: the path's name
            values = passes.setdefault((path, name), iter(cpus[path]))
            return Figures(rate=1000.0, cpu_us=next(values))

        return run

    loads = [Workload(name, load(name)) for name in WARM_LOADS]
    return loads, lambda path: path


def passes_until_warm(cpus: dict[str, list[float | None]], fixed: int | None = None) -> int:
    loads, run_of = scripted(cpus)
    args = argparse.Namespace(warmup_passes=fixed)
    return warm_up(args, list(cpus), loads, run_of)


NEVER: list[float | None] = [None] * WARM_PASSES[1]  # direct: no proxy CPU
SETTLES_AT_3: list[float | None] = [
    10.0,
    5.0,
    5.2,
    5.1,
    5.0,
    5.0,
    5.0,
    5.0,
]  # within 10 % from pass 2 to 3
JUMPY: list[float | None] = [10.0, 5.0, 10.0, 5.0, 10.0, 5.0, 10.0, 5.0]


def test_the_warm_up_ends_once_the_peer_settles_within_its_bounds() -> None:
    assert passes_until_warm({"apache-proxy": SETTLES_AT_3, "sluice": JUMPY}) == 3
    # at least two passes, even when the first two agree
    assert passes_until_warm({"apache-proxy": [5.0] * 8}) == WARM_PASSES[0]
    # at most eight
    assert passes_until_warm({"apache-proxy": JUMPY, "sluice": SETTLES_AT_3}) == WARM_PASSES[1]
    # --warmup-passes N: exactly N
    assert passes_until_warm({"apache-proxy": SETTLES_AT_3}, fixed=5) == 5


def test_without_the_peer_the_first_proxy_path_is_watched_not_direct() -> None:
    """The filter runs' paths begin with direct (README: --paths
    direct,sluice,sluice-filter-noop,...): direct has no proxy CPU, and
    watching it the warm-up never settled and always ran eight passes."""
    cpus = {"direct": NEVER, "sluice": SETTLES_AT_3, "sluice-schema": JUMPY}
    assert passes_until_warm(cpus) == 3
    # with no proxy path at all, nothing can settle: the least passes
    assert passes_until_warm({"direct": NEVER}) == WARM_PASSES[0]


def test_vs_peer_is_the_ratio_of_medians_with_each_round_s_own_ratio_s_spread() -> None:
    """Three rounds, the peer's and sluice's figures of the same round side
    by side. msg/s: medians 160 / 150 = 1.07, and each round's own 1.20,
    0.80, 1.20 (the lowest over the lowest would read 1.20, the highest over
    the highest 0.90); publish p99 18 / 20 with 1.20, 0.90, 1.50; CPU 0.6 /
    0.5 with 1.40, 1.50, 1.00. No end-to-end latency: "-" as before."""
    peer = [(100.0, 10.0, 0.5), (200.0, 20.0, 0.4), (150.0, 40.0, 0.6)]
    mine = [(120.0, 12.0, 0.7), (160.0, 18.0, 0.6), (180.0, 60.0, 0.6)]

    def cell(rounds: list[tuple[float, float, float]]) -> Cell:
        return Cell([Figures(rate=rate, publish=(1.0, p99, p99 + 5), cpu_us=cpu)
                     for rate, p99, cpu in rounds])  # fmt: skip

    load = "perf 1K max"
    cells = {("apache-proxy", load): cell(peer), ("sluice", load): cell(mine)}
    lines = table(cells, ["apache-proxy", "sluice"], [load]).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {r[1]: r for r in ([c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:])}
    assert len(head) == len(rows["sluice"]) == 13
    sluice = dict(zip(head, rows["sluice"], strict=True))
    assert sluice["msg/s"] == "160 (120-180)"  # the cell's own spread, unchanged
    vs = [c for h, c in zip(head, rows["sluice"], strict=True) if h.startswith("vs peer")]
    assert vs == ["1.07 (0.80-1.20)", "0.90 (0.90-1.50)", "-", "1.20 (1.00-1.50)"]
    assert [c for h, c in zip(head, rows["apache-proxy"], strict=True)
            if h.startswith("vs peer")] == ["", "", "", ""]  # fmt: skip


def test_a_watcher_that_gets_no_answer_says_so() -> None:
    """A live watcher whose proxy never answers (here: nobody listens) is
    not watching; the sluice-live row would be an unwatched `sluice`."""
    watcher = Watcher(free_port(), "token")
    try:
        with pytest.raises(SystemExit, match=r"gave no answer in 0\.5 s \(\d+ tries; last: "):
            watcher.answered(0.5)
        with pytest.raises(SystemExit, match="last answered never"):
            watcher.still_answered(30)
    finally:
        watcher.stop()
    assert watcher.answers == 0 and watcher.failures >= 1


@pytest.mark.e2e
def test_a_watcher_is_answered_by_a_proxy_with_its_token(tmp_path: Path) -> None:
    """The real `sluice proxy` answers the watcher holding its admin token,
    and refuses one holding another: that one says so instead of retrying
    unseen for the whole run."""
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(16))
    proxy = start_proxy("pulsar://127.0.0.1:1", tmp_path, "--admin", "127.0.0.1:0",
                        "--admin-token-file", str(token), "--no-check-broker")  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while (admin := ADMIN.search(proxy.log())) is None:
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.05)
        port = int(admin.group(1))
        watching = Watcher(port, token.read_text())
        refused = Watcher(port, "not-the-token")
        try:
            watching.answered(10)
            watching.still_answered(10)
            with pytest.raises(SystemExit, match="HTTP Error 401"):
                refused.answered(1)
        finally:
            watching.stop()
            refused.stop()
    finally:
        proxy.kill()


BURN_IN_A_CHILD = """
import subprocess, sys
burn = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"
subprocess.run([sys.executable, "-c", burn], check=True)  # run, ended and reaped
print("reaped", flush=True)
sys.stdin.read()
"""


@pytest.mark.e2e
def test_the_meter_keeps_the_cpu_of_a_child_that_ended_and_was_reaped() -> None:
    # A `--workers` worker that dies and is restarted: its CPU must stay in
    # the proxy tree's total, where a clock per live process loses it.
    import subprocess
    import sys

    from bench.peers import Meter

    parent = subprocess.Popen(
        [sys.executable, "-c", BURN_IN_A_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline() == "reaped\n"
        assert Meter(parent.pid).cpu() >= 0.35
    finally:
        parent.kill()
        parent.wait()


def test_a_filter_path_whose_filter_missed_its_messages_ends_the_run() -> None:
    from bench.peers import REFUSED, SEEN, unfiltered

    def counts(messages: float, replaced: float = 0.0) -> dict[str, float]:
        return dict.fromkeys(REFUSED, 0.0) | dict(zip(SEEN, (messages, replaced), strict=True))

    produced = {"sluice": 9_000, "sluice-schema": 9_000, "sluice-encrypt": 9_000}
    assert unfiltered({"sluice": counts(0), "sluice-schema": counts(9_500)}, produced) is None
    assert unfiltered({"sluice-encrypt": counts(0, 9_000)}, produced) is None
    assert unfiltered({"sluice-schema": counts(0)}, produced) == (
        "sluice-schema: its filter saw 0 messages (sluice_filter_messages_total), "
        "of at least 9,000 produced through it"
    )
    assert unfiltered({"sluice-encrypt": counts(9_000, 10)}, produced) is not None


def test_chosen_workloads_bring_the_rows_they_read_and_the_idle_row() -> None:
    assert [w.name for w in workloads(1.0, ["py consume"])] == ["py 1K", "py consume", "idle"]
    assert [w.name for w in workloads(1.0, ["perf 1K @100/s"])] == ["perf 1K @100/s", "idle"]
    assert len(workloads(1.0)) == 10
    with pytest.raises(ValueError, match="no workload 'py 2K': the workloads are 'perf 1K max'"):
        workloads(1.0, ["py 2K"])
