"""--workers and port-per-broker: the supervisor keeps every port of
--listener-ports bound, so a forgotten broker's port must stop standing for
it in the workers' journal: once every worker has forgotten the broker, a
connection to its port is closed at once (its client looks up again); a
worker that still has it keeps it relayed; a lookup naming it again gives it
back its port. Two workers' BrokerPorts on one journal in one process; no
socket, no process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from sluice.addresses import Address
from sluice.proxy.ports import BrokerPorts, Listeners
from sluice.proxy.shared import (
    BROKER_PORTS_FILE,
    BROKER_PORTS_LOCK,
    BROKER_PORTS_VOTES,
    SharedBrokerPorts,
    create_state,
)

GONE = Address("10.1.2.3", 6650)
POOL = [41000, 41001, 41002]


def _worker(state: Path, index: int, journal: Path | None = None) -> BrokerPorts:
    """Worker ``index`` of two: its port-per-broker listeners, the
    supervisor's ports (as ``sluice.proxy.workers`` wires them)."""
    shared = SharedBrokerPorts(journal or state / BROKER_PORTS_FILE, lock=state / BROKER_PORTS_LOCK)
    shared.share_forgetting(index, 2, state / BROKER_PORTS_VOTES)
    ports = BrokerPorts("127.0.0.1", None, (POOL[0], POOL[-1]), shared, list(POOL),
                        lambda listener, kind: listener)  # fmt: skip
    ports.map = Listeners()
    return ports


def test_a_port_relays_no_more_once_every_worker_forgot_its_broker(tmp_path: Path) -> None:
    create_state(tmp_path, 2)
    one, two = _worker(tmp_path, 0), _worker(tmp_path, 1)

    async def test() -> None:
        port = (await one.open(GONE)).port
        assert two.broker_of(port) == (GONE, "plain")  # a connection there: relayed
        await one.forget(GONE)
        # Worker two has not forgotten it (it may still see it named).
        assert one.broker_of(port) == two.broker_of(port) == (GONE, "plain")
        await two.forget(GONE)
        # Forgotten by both: a connection to its port, on either, is closed.
        assert one.broker_of(port) is None and two.broker_of(port) is None
        # Named again (an HTTP lookup on worker two): the same port, relayed again.
        assert (await two.open(GONE)).port == port
        assert one.broker_of(port) == (GONE, "plain")
        # Forgotten by one, again: two, which was asked for it since, keeps it.
        await one.forget(GONE)
        assert two.broker_of(port) == (GONE, "plain")

    try:
        trio.run(test)
    finally:
        for ports in (one, two):
            assert ports.journal is not None
            ports.journal.close()


def test_a_worker_asked_for_a_broker_it_forgot_takes_its_forgetting_back(
    tmp_path: Path,
) -> None:
    create_state(tmp_path, 2)
    one, two = _worker(tmp_path, 0), _worker(tmp_path, 1)

    async def test() -> None:
        port = (await one.open(GONE)).port
        await one.forget(GONE)
        assert one.broker_of(port) == (GONE, "plain")  # a connection still relayed
        assert (await one.open(GONE)).port == port  # named to worker one again
        await two.forget(GONE)
        assert two.broker_of(port) == (GONE, "plain")  # one still has it

    try:
        trio.run(test)
    finally:
        for ports in (one, two):
            assert ports.journal is not None
            ports.journal.close()


def test_with_a_ports_file_a_forgotten_brokers_port_stays_its_own(tmp_path: Path) -> None:
    """--broker-ports-file outlives the run: the next run's workers relay
    nothing on a forgotten broker's port, which stays the broker's."""
    state, later = tmp_path / "run1", tmp_path / "run2"
    state.mkdir()
    later.mkdir()
    create_state(state, 2)
    create_state(later, 2)
    kept = tmp_path / "broker-ports"
    kept.touch()
    one, two = _worker(state, 0, kept), _worker(state, 1, kept)
    other = Address("10.1.2.4", 6650)

    async def test() -> None:
        port = (await one.open(GONE)).port
        await one.forget(GONE)
        await two.forget(GONE)
        assert one.broker_of(port) is None
        assert (await two.open(other)).port != port  # another broker: another port
        three = _worker(later, 0, kept)
        try:
            assert three.broker_of(port) is None
            assert (await three.open(GONE)).port == port
            assert three.broker_of(port) == (GONE, "plain")
        finally:
            assert three.journal is not None
            three.journal.close()

    try:
        trio.run(test)
    finally:
        for ports in (one, two):
            assert ports.journal is not None
            ports.journal.close()


def test_a_lone_proxy_restarted_does_not_listen_for_a_forgotten_broker(tmp_path: Path) -> None:
    """A lone proxy's --broker-ports-file: a broker forgotten in one run is
    not listened for by the next (which listens at start for the others
    the file names), and keeps its port for when a lookup names it."""
    kept = tmp_path / "broker-ports"
    served: list[tuple[trio.abc.Listener[Any], Address]] = []

    def lone() -> BrokerPorts:
        journal = SharedBrokerPorts(kept, held=True)
        ports = BrokerPorts("127.0.0.1", None, None, journal, None, lambda lis, kind: lis)
        ports.map = Listeners()
        ports.serve = lambda listener, upstream, kind: served.append((listener, upstream))
        return ports

    other = Address("10.1.2.4", 6650)

    async def test() -> None:
        first = lone()
        port = (await first.open(GONE)).port
        await first.open(other)
        assert await first.forget(GONE)
        for listener, _ in served:
            await listener.aclose()
        served.clear()
        assert first.journal is not None
        first.journal.close()
        second = lone()
        try:
            await second.reopen_known()
            assert [upstream for _, upstream in served] == [other]
            assert (await second.open(GONE)).port == port
        finally:
            for listener, _ in served:
                await listener.aclose()
            assert second.journal is not None
            second.journal.close()

    trio.run(test)
