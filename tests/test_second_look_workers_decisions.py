"""``--workers``: a reload decision the supervisor could not write whole
(its state directory's disk full mid-line, or a crash) left a line
without its end; the next decision was appended to it, the two read as
one line of three words, and no worker saw that next decision: the
supervisor put a configuration in force that every worker dropped."""

from __future__ import annotations

import shutil

from sluice.addresses import Address
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.shared import Journal
from sluice.proxy.workers import COMMIT, RELOAD_DECISIONS, Supervisor


def _supervisor() -> Supervisor:
    config = ProxyConfig(broker=parse_broker_url("pulsar://127.0.0.1:6650"),
                         listen=Address("127.0.0.1", 0))  # fmt: skip
    return Supervisor(config, 2, log_level="warning")


def test_a_decision_after_a_torn_line_is_read_by_the_workers() -> None:
    supervisor = _supervisor()
    try:
        path = supervisor._state / RELOAD_DECISIONS
        # A worker reads the journal as it stands (its own Journal, opened
        # before the torn write: it never ends that line itself).
        path.write_bytes(b"1 commit\n")
        reader = Journal(path)
        assert list(reader.new_lines()) == [["1", "commit"]]
        with open(path, "ab") as torn:  # what a full disk let through of "2 abort\n"
            torn.write(b"2 ab")
        assert supervisor._decide(3, COMMIT) == ""
        decided = {int(w[0]): w[1] for w in reader.new_lines() if len(w) == 2}
        assert decided.get(3) == COMMIT, path.read_bytes()
        reader.close()
    finally:
        shutil.rmtree(supervisor._state, ignore_errors=True)
