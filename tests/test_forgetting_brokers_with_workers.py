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
from sluice.protocols.pulsar.connection import FORGET_AFTER, PulsarConnection
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.ports import BrokerPorts, Listeners
from sluice.proxy.pulsar import SharedRouting
from sluice.proxy.shared import (
    BROKER_PORTS_FILE,
    BROKER_PORTS_LOCK,
    BROKER_PORTS_VOTES,
    ROUTES_FILE,
    SharedBrokerPorts,
    create_state,
    learned_from_ports_file,
    mark_time,
)
from sluice.proxy.workers import share_forgetting
from tests.test_forgetting_brokers import BROKER, _connect, _core, _dialled, _lookup

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
            # (Returned for the backend, to be forgotten unless named.)
            assert await second.reopen_known() == [other]
            assert [upstream for _, upstream in served] == [other]
            assert (await second.open(GONE)).port == port
        finally:
            for listener, _ in served:
                await listener.aclose()
            assert second.journal is not None
            second.journal.close()

    trio.run(test)


# --- the routes journal: what a worker started in a dead one's place trusts ------


def _routing_worker(state: Path, index: int) -> tuple[SharedRouting, BrokerPorts]:
    """Worker ``index`` of two as ``sluice.proxy.workers`` starts one (also
    in a dead one's place): its routing and its port-per-broker listeners
    (no --listener-ports), what it forgets shared (``share_forgetting``)."""
    routing = SharedRouting(parse_broker_url(BROKER), state / ROUTES_FILE)
    ports = BrokerPorts("127.0.0.1", None, None, None, None, lambda listener, kind: listener)
    ports.map = Listeners()
    share_forgetting(ports, routing, state, index, 2)
    return routing, ports


async def _sweep(routing: SharedRouting, ports: BrokerPorts, now: float) -> list[Address]:
    """The backend's sweep (``PulsarBackend._forget_brokers``) at ``now``."""
    routing.expire(now)
    forgotten, routing.forgotten = routing.forgotten, []
    for address in forgotten:
        await ports.forget(address)
    return forgotten


def _connects(routing: SharedRouting, address: Address, now: float) -> PulsarConnection | None:
    """A client's CONNECT naming ``address``: its core if it was dialled."""
    core = _core(routing)
    return core if _dialled(core.receive_client(_connect(str(address)), now)) else None


def test_a_restarted_worker_does_not_trust_what_every_other_worker_forgot(
    tmp_path: Path,
) -> None:
    """A worker started in a dead one's place reads every broker ever
    learned from the routes journal: one every other worker has forgotten
    since it was last named is not trusted again (it stayed allowed for
    another hour, at every restart); one named again since, or kept by a
    worker with a connection to it open, is."""
    create_state(tmp_path, 2)
    kept, back = Address("10.1.2.4", 6650), Address("10.1.2.5", 6650)
    one, two = _routing_worker(tmp_path, 0), _routing_worker(tmp_path, 1)
    started: list[SharedRouting] = []

    async def test() -> None:
        for named in (GONE, kept, back):
            _lookup(one[0], f"pulsar://{named}", 0.0)
        held = _connects(two[0], kept, 1.0)  # open on worker two past the hour
        assert held is not None
        assert await _sweep(*two, 1.0) == []
        late = FORGET_AFTER + 10.0
        assert set(await _sweep(*one, late)) == {GONE, kept, back}
        assert set(await _sweep(*two, late)) == {GONE, back}
        _lookup(one[0], f"pulsar://{back}", late + 1)  # named again
        # Worker one starting again: two has forgotten GONE, and still has
        # kept (a connection open); back was named since.
        fresh, _ = _routing_worker(tmp_path, 0)
        started.append(fresh)
        assert not fresh.allowlist.allows(GONE) and GONE not in fresh.routes
        assert _connects(fresh, GONE, late + 2) is None
        assert fresh.allowlist.allows(kept) and fresh.allowlist.allows(back)
        # Worker two dies (its connection with it) and starts again: worker
        # one had forgotten GONE and kept.
        again, again_ports = _routing_worker(tmp_path, 1)
        started.append(again)
        assert not again.allowlist.allows(GONE) and not again.allowlist.allows(kept)
        assert _connects(again, back, late + 2) is not None
        # Queued for its backend, which forgets their ports too.
        assert set(await _sweep(again, again_ports, late + 3)) == {GONE, kept}

    try:
        trio.run(test)
    finally:
        for routing in (one[0], two[0], *started):
            routing.close()


def test_a_broker_learned_again_before_the_sweep_is_not_written_forgotten(
    tmp_path: Path,
) -> None:
    """A core forgets a broker at a client's CONNECT; a lookup names it
    again before the backend's sweep reports the forgetting: the sweep
    writes no forgetting after the line learning it again, and a worker
    started in the other's place trusts it, as this one does."""
    create_state(tmp_path, 2)
    one, two = _routing_worker(tmp_path, 0), _routing_worker(tmp_path, 1)
    started: list[SharedRouting] = []

    async def test() -> None:
        _lookup(one[0], f"pulsar://{GONE}", 0.0)
        assert await _sweep(*two, 1.0) == []
        late = FORGET_AFTER + 10.0
        assert await _sweep(*two, late) == [GONE]
        # At a CONNECT on worker one: forgotten there, queued for the sweep.
        assert _connects(one[0], GONE, late) is None and one[0].forgotten == [GONE]
        _lookup(one[0], f"pulsar://{GONE}", late + 1)  # named again, on one
        assert await _sweep(*one, late + 2) == [GONE]  # (the one queued)
        assert one[0].allowlist.allows(GONE)
        again, _ = _routing_worker(tmp_path, 1)
        started.append(again)
        assert again.allowlist.allows(GONE)

    try:
        trio.run(test)
    finally:
        for routing in (one[0], two[0], *started):
            routing.close()


def test_brokers_only_an_earlier_runs_ports_file_names_are_forgotten_too(
    tmp_path: Path,
) -> None:
    """--broker-ports-file: the brokers an earlier run gave ports, which the
    supervisor writes in the routes journal as learned at start, are
    forgotten an hour on unless named again (their ports relayed to them
    for ever: no routing of this run learned them), and the file marks
    them forgotten for the next run; one the file marks forgotten already
    is not learned."""
    kept = tmp_path / "broker-ports"
    kept.write_text(
        "41000 10.1.2.3 6650 plain\n41001 10.1.2.4 6650 plain\n"
        "41002 10.1.2.6 6650 plain\n41002 10.1.2.6 6650 plain forgotten\n"
    )
    state = tmp_path / "run"
    state.mkdir()
    create_state(state, 2)
    named = Address("10.1.2.4", 6650)
    assert learned_from_ports_file(state, kept, (POOL[0], POOL[-1]), False) == [GONE, named]
    workers: list[tuple[SharedRouting, BrokerPorts]] = []
    for index in range(2):
        journal = SharedBrokerPorts(kept, lock=state / BROKER_PORTS_LOCK)
        ports = BrokerPorts("127.0.0.1", None, (POOL[0], POOL[-1]), journal, list(POOL),
                            lambda listener, kind: listener)  # fmt: skip
        ports.map = Listeners()
        routing = SharedRouting(parse_broker_url(BROKER), state / ROUTES_FILE)
        share_forgetting(ports, routing, state, index, 2)
        workers.append((routing, ports))
    (one, one_ports), (two, two_ports) = workers

    async def test() -> None:
        assert one_ports.broker_of(41000) == (GONE, "plain")  # relayed, as before
        assert one.allowlist.allows(GONE) and not one.allowlist.allows(Address("10.1.2.6", 6650))
        for worker in workers:
            assert await _sweep(*worker, 1.0) == []
        for now in (FORGET_AFTER / 4, FORGET_AFTER * 3 / 4):  # named in this run, on two
            _lookup(two, f"pulsar://{named}", now)
        late = FORGET_AFTER + 10.0
        for worker in workers:
            assert await _sweep(*worker, late) == [GONE]
        assert one_ports.broker_of(41000) is None and two_ports.broker_of(41000) is None
        assert two_ports.broker_of(41001) == (named, "plain")
        later = SharedBrokerPorts(kept)
        try:
            later.refresh()
            assert later.forgotten == {41000, 41002}
        finally:
            later.close()

    try:
        trio.run(test)
    finally:
        for routing, ports in workers:
            routing.close()
            assert ports.journal is not None
            ports.journal.close()


def test_a_restarted_worker_dates_what_it_reads_by_the_supervisors_marks(
    tmp_path: Path,
) -> None:
    """A worker started in a dead one's place takes a broker it reads from
    the routes journal as named when the supervisor's clock marks date its
    last line, not at its own start: it forgets one nobody named for an
    hour at its first sweep, as the other workers do, and another an hour
    after its last naming (each stayed allowed for an hour after every
    restart)."""
    create_state(tmp_path, 2)
    other = Address("10.1.2.4", 6650)
    mark_time(tmp_path, 1000.0)  # the supervisor's clock (time.monotonic's)
    one, _ = _routing_worker(tmp_path, 0)
    started: list[SharedRouting] = []

    async def test() -> None:
        for named in (GONE, other):
            _lookup(one, f"pulsar://{named}", 0.0)  # (worker one's clock)
        mark_time(tmp_path, 1060.0)
        _lookup(one, f"pulsar://{other}", FORGET_AFTER * 0.75)  # named again: learned afresh
        mark_time(tmp_path, 1060.0 + FORGET_AFTER * 0.75)
        # Worker two starts, its own clock at 5, the supervisor's past the hour.
        again = SharedRouting(parse_broker_url(BROKER), tmp_path / ROUTES_FILE)
        started.append(again)
        ports = BrokerPorts("127.0.0.1", None, None, None, None, lambda lis, kind: lis)
        ports.map = Listeners()
        share_forgetting(ports, again, tmp_path, 1, 2, (5.0, 1000.0 + FORGET_AFTER + 100))
        assert again.allowlist.allows(GONE) and again.allowlist.allows(other)
        assert await _sweep(again, ports, 5.0) == [GONE]
        assert await _sweep(again, ports, 5.0 + FORGET_AFTER * 0.5) == []
        assert await _sweep(again, ports, 5.0 + FORGET_AFTER * 0.75) == [other]

    try:
        trio.run(test)
    finally:
        for routing in (one, *started):
            routing.close()
