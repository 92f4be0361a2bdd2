"""bench/peers.py's rules on figures given to them (the warm-up's stop
condition), and the live path's watcher, which must say when nobody is
watching (one test beside a real `sluice proxy`, no broker)."""

from __future__ import annotations

import argparse
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.peers import ADMIN, WARM_LOADS, WARM_PASSES, Figures, Watcher, Workload, warm_up
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
