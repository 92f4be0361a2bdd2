"""bench/e2e.py's medians and ratios come from the same rounds on every
path, when the broker stalled on one of them (no broker here: the rounds'
figures are given)."""

from __future__ import annotations

import statistics

from bench.e2e import same_rounds


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
