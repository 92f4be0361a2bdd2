"""bench/e2e.py's medians and ratios come from the same rounds on every
path, when the broker stalled on one of them (no broker here: the rounds'
figures are given), and the proxy's CPU is read finely enough for the few
milliseconds a round costs it."""

from __future__ import annotations

import os
import statistics
import time

from bench.e2e import cpu_seconds, ratio_range, same_rounds


def test_a_round_stalled_on_one_path_leaves_every_path_s_median() -> None:
    direct = {0: 100.0, 1: 200.0, 2: 110.0}
    proxy = {0: 95.0, 2: 100.0}  # round 1: the broker stalled consuming through the proxy
    against = {0: 90.0, 1: 180.0, 2: 99.0}
    kept = same_rounds([direct, proxy, against])
    assert kept == [0, 2]
    ratio = statistics.median(proxy[n] for n in kept) / statistics.median(direct[n] for n in kept)
    assert round(ratio, 3) == 0.929  # 97.5 / 105; with direct's round 1 kept, 97.5 / 110


def test_rounds_are_kept_in_order_and_none_when_no_round_is_complete() -> None:
    assert same_rounds([{2: 1.0, 0: 1.0, 1: 1.0}, {1: 1.0, 2: 1.0, 0: 1.0}]) == [0, 1, 2]
    assert same_rounds([{0: 1.0}, {1: 1.0}]) == []
    assert same_rounds([]) == []


def test_a_process_s_cpu_is_read_finer_than_a_clock_tick() -> None:
    """5,000 messages at 10 us are 50 ms of the proxy's CPU: read in /proc's
    10 ms ticks, a round's CPU per message was off by up to a fifth."""
    pid = os.getpid()
    before = cpu_seconds(pid)
    start = time.process_time()
    while time.process_time() - start < 0.003:  # 3 ms of this process's CPU
        pass
    used = cpu_seconds(pid) - before
    assert 0.0025 < used < 0.008, used  # ticks read 0 or 10 ms


def test_a_ratio_s_spread_is_of_each_round_s_own_ratio() -> None:
    """Round by round (1.125 and 0.917), not the lowest over the lowest
    (90 / 80) and the highest over the highest (110 / 120)."""
    assert ratio_range([90.0, 110.0], [80.0, 120.0]) == "0.92-1.12"
    assert ratio_range([90.0], [0.0]) == "-"
