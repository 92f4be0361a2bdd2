"""Learned brokers are forgotten when no answer has named them for a while
and no connection to them is open: not allowed, nor routed, and their
per-broker listeners closed (a broker's address, once it left the cluster,
may be another program's). Sans-I/O on the cores' clock, and real sockets
on loopback for the listeners; no process is started."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from sluice.addresses import Address, AllowList
from sluice.protocols.core import Ask, Close, Conn, OnInvalid, OpenUpstream
from sluice.protocols.pulsar import command, decode_frame, decode_stream, encode, pb
from sluice.protocols.pulsar.connection import (
    FORGET_AFTER,
    PulsarConnection,
    PulsarSettings,
    Routing,
)
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.ports import BrokerPorts, Listeners
from sluice.proxy.pulsar import SharedRouting
from sluice.proxy.shared import SharedBrokerPorts
from tests.test_pulsar_core import Recording

T = pb.BaseCommand
LookupResponse = pb.CommandLookupTopicResponse
BROKER = "pulsar://127.0.0.1:6650"
GONE = Address("10.1.2.3", 6650)


def _core(routing: Routing, trusted: tuple[str, ...] = ()) -> PulsarConnection:
    settings = PulsarSettings(OnInvalid.REJECT, 5 << 20, 5)
    settings.trusted = AllowList(trusted, "--trust-broker")
    return PulsarConnection(Conn(1, "127.0.0.1:5000", "plain", "pulsar"), settings, routing,
                            Recording())  # fmt: skip


def _connect(proxy_to: str | None = None) -> bytes:
    body = pb.CommandConnect(client_version="test", protocol_version=21)
    if proxy_to is not None:
        body.proxy_to_broker_url = proxy_to
    return encode(command(T.CONNECT, body))


def _lookup(routing: Routing, named: str, now: float) -> None:
    """A lookup connection whose lookup the upstream answers naming ``named``."""
    core = _core(routing)
    core.receive_client(_connect(), now)
    lookup = pb.CommandLookupTopic(topic="persistent://t/n/a", request_id=7)
    (ask,) = core.receive_client(encode(command(T.LOOKUP, lookup)), now)
    assert isinstance(ask, Ask)
    answer = LookupResponse(request_id=1, response=LookupResponse.Connect, brokerServiceUrl=named)
    core.answered(ask.token, decode_frame(encode(command(T.LOOKUP_RESPONSE, answer))), now)
    core.closed("done")


def _relay(routing: Routing, now: float) -> tuple[PulsarConnection, list[Any]]:
    """A client's CONNECT naming GONE: its core and what it did."""
    core = _core(routing)
    return core, core.receive_client(_connect(str(GONE)), now)


def _dialled(actions: list[Any]) -> bool:
    return any(isinstance(a, OpenUpstream) for a in actions)


def test_a_broker_no_answer_names_any_more_is_forgotten_and_not_dialled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    routing = Routing(parse_broker_url(BROKER))
    _lookup(routing, f"pulsar://{GONE}", 0.0)
    assert routing.allowlist.allows(GONE) and GONE in routing.routes
    # Named again within the hour: kept an hour from then.
    _lookup(routing, f"pulsar://{GONE}", 1800.0)
    core, out = _relay(routing, FORGET_AFTER + 100.0)
    assert _dialled(out)
    core.closed("done")
    caplog.set_level(logging.INFO, "sluice.pulsar")
    late = 1800.0 + FORGET_AFTER + 1.0
    core, out = _relay(routing, late)
    assert not _dialled(out)  # the address may be anybody's now
    (error,) = decode_stream(b"".join(a.data for a in out if hasattr(a, "data")), 1 << 20)
    assert error.body.error == pb.ServiceNotReady
    assert isinstance(out[-1], Close)
    assert not routing.allowlist.allows(GONE) and GONE not in routing.routes
    assert routing.forgotten == [GONE]
    lines = [r.getMessage() for r in caplog.records if "forgotten" in r.getMessage()]
    assert len(lines) == 1 and str(GONE) in lines[0], lines
    # A lookup naming it again learns it again.
    _lookup(routing, f"pulsar://{GONE}", late + 10)
    assert _dialled(_relay(routing, late + 20)[1])


def test_a_broker_with_a_connection_open_the_configured_and_trusted_ones_are_kept() -> None:
    routing = Routing(parse_broker_url(BROKER))
    _lookup(routing, f"pulsar://{GONE}", 0.0)
    _lookup(routing, "pulsar://10.1.2.4:6650", 0.0)
    core, out = _relay(routing, 1.0)
    assert _dialled(out)  # open, and held open past the hour
    later = 3 * FORGET_AFTER
    assert routing.expire(later, AllowList(("10.1.2.4",), "--trust-broker")) == []
    assert routing.allowlist.allows(GONE)
    assert routing.allowlist.allows(Address("127.0.0.1", 6650))
    core.closed("done")
    assert set(routing.expire(later + 60, AllowList())) == {Address("10.1.2.4", 6650), GONE}
    assert routing.allowlist.allows(Address("127.0.0.1", 6650))  # --broker: never


def test_workers_keep_a_broker_that_any_of_them_sees_named(tmp_path: Path) -> None:
    """With --workers a lookup answered by one worker and the CONNECT on
    another work: a worker that is never asked about a broker keeps it as
    long as another sees it named (it learns it afresh in the journal)."""
    journal = tmp_path / "routes"
    journal.touch()
    one = SharedRouting(parse_broker_url(BROKER), journal)
    two = SharedRouting(parse_broker_url(BROKER), journal)
    try:
        _lookup(one, f"pulsar://{GONE}", 0.0)
        core, out = _relay(two, 1.0)  # the lookup on one, the CONNECT on two
        assert _dialled(out)
        core.closed("done")
        now = 0.0
        while now < 3 * FORGET_AFTER:
            now += 600.0
            _lookup(one, f"pulsar://{GONE}", now)
            assert one.expire(now) == two.expire(now) == []
            assert two.allowlist.knows(GONE), now
        # Nobody names it any more: both forget it.
        late = now + FORGET_AFTER + 1
        assert one.expire(late) == two.expire(late) == [GONE]
        assert not two.allowlist.allows(GONE)
    finally:
        one.close()
        two.close()


def test_a_forgotten_brokers_listener_is_closed_and_its_port_kept(tmp_path: Path) -> None:
    """Port-per-broker: a forgotten broker's listener is closed (a client
    dialling it is refused, and looks its topic up again); with
    --broker-ports-file, the broker gets the same port when it is named
    again."""
    journal = SharedBrokerPorts(tmp_path / "ports", held=True)
    served: list[tuple[trio.abc.Listener[Any], Address]] = []

    async def test() -> None:
        ports = BrokerPorts("127.0.0.1", None, None, journal, None, lambda lis, kind: lis)
        ports.map = Listeners()
        ports.serve = lambda listener, upstream, kind: served.append((listener, upstream))
        clock = [100.0]
        ports.clock = lambda: clock[0]
        told = await ports.open(GONE)
        stream = await trio.open_tcp_stream("127.0.0.1", told.port)
        await stream.aclose()
        assert ports.asked_since(GONE, 100.0) and not ports.asked_since(GONE, 101.0)
        assert await ports.forget(GONE)
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", told.port)
        assert ports.map is not None and ports.map.listener_for(GONE) is None
        clock[0] = 200.0
        again = await ports.open(GONE)
        assert again == told and len(served) == 2
        await trio.open_tcp_stream("127.0.0.1", told.port)
        assert not await ports.forget(Address("10.9.9.9", 1))
        for listener, _ in served:
            await listener.aclose()

    try:
        trio.run(test)
    finally:
        journal.close()


def test_without_a_ports_file_a_forgotten_brokers_port_is_given_again(tmp_path: Path) -> None:
    """Without --broker-ports-file, --listener-ports does not fill up with
    brokers that left: a forgotten broker's port is free for the next."""
    served: list[tuple[trio.abc.Listener[Any], Address]] = []

    async def test() -> None:
        probe = trio.socket.socket()
        await probe.bind(("127.0.0.1", 0))
        low = probe.getsockname()[1]
        probe.close()
        ports = BrokerPorts("127.0.0.1", None, (low, low), None, None, lambda lis, kind: lis)
        ports.map = Listeners()
        ports.serve = lambda listener, upstream, kind: served.append((listener, upstream))
        assert (await ports.open(GONE)).port == low
        assert await ports.forget(GONE)
        assert (await ports.open(Address("10.1.2.9", 6650))).port == low
        for listener, _ in served:
            await listener.aclose()

    trio.run(test)


def test_the_backend_forgets_a_broker_http_lookups_stopped_naming_and_closes_its_listener() -> None:
    """proxy/pulsar.py's wiring: a broker an HTTP lookup named is kept while
    such lookups name it (their answers are rewritten, not learned afresh),
    then, an hour after the last, forgotten by the backend's sweep with no
    client connecting: no longer allowed, its listener closed."""
    from trio.testing import MockClock, wait_all_tasks_blocked

    from sluice.proxy.dial import TlsClientConfig
    from sluice.proxy.pulsar import PulsarBackend
    from sluice.proxy.server import closed_listener

    served: list[trio.abc.Listener[Any]] = []
    # Moved by hand: a clock that jumps whenever all tasks wait would jump
    # past the hour while a listener's socket is being opened.
    clock = MockClock()

    async def advance(seconds: float) -> None:
        for _ in range(int(seconds // 30)):
            clock.jump(30)
            await wait_all_tasks_blocked()

    async def test() -> None:
        ports = BrokerPorts("127.0.0.1", None, None, None, None, lambda lis, kind: lis)
        ports.serve = lambda listener, upstream, kind: served.append(listener)
        routing = Routing(parse_broker_url(BROKER))
        settings = PulsarSettings(OnInvalid.REJECT, 5 << 20, 5)
        backend = PulsarBackend(
            parse_broker_url(BROKER),
            settings,
            routing,
            broker_tls=TlsClientConfig(),
            connect_timeout=5,
            ports=ports,
        )
        named = ["pulsar://10.1.2.3:6650"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(backend._forget_brokers)
            first = await backend.listener_urls(named)
            assert routing.allowlist.allows(GONE) and len(served) == 1
            await advance(FORGET_AFTER * 0.75)
            assert await backend.listener_urls(named) == first  # named again: kept
            await advance(FORGET_AFTER * 0.75)
            assert routing.allowlist.allows(GONE) and not closed_listener(served[0])
            await advance(FORGET_AFTER * 0.5)  # an hour and a quarter since
            assert not routing.allowlist.allows(GONE)
            assert closed_listener(served[0]) and routing.forgotten == []
            nursery.cancel_scope.cancel()

    trio.run(test, clock=clock)


def test_a_broker_named_again_before_the_sweep_keeps_its_listener() -> None:
    """A core forgets a broker at a client's CONNECT (no answer named it
    for an hour) and an HTTP lookup names it again before the backend's
    sweep comes to it: that lookup's client is told the listener it had,
    which the sweep leaves open (it closed it, and the client's dial was
    refused)."""
    from trio.testing import MockClock, wait_all_tasks_blocked

    from sluice.protocols.pulsar.connection import SWEEP_EVERY
    from sluice.proxy.dial import TlsClientConfig
    from sluice.proxy.pulsar import PulsarBackend
    from sluice.proxy.server import closed_listener

    served: list[trio.abc.Listener[Any]] = []
    clock = MockClock()

    async def test() -> None:
        ports = BrokerPorts("127.0.0.1", None, None, None, None, lambda lis, kind: lis)
        ports.serve = lambda listener, upstream, kind: served.append(listener)
        routing = Routing(parse_broker_url(BROKER))
        backend = PulsarBackend(
            parse_broker_url(BROKER),
            PulsarSettings(OnInvalid.REJECT, 5 << 20, 5),
            routing,
            broker_tls=TlsClientConfig(),
            connect_timeout=5,
            ports=ports,
        )
        named = [f"pulsar://{GONE}"]
        async with trio.open_nursery() as nursery:
            first = await backend.listener_urls(named)
            clock.jump(FORGET_AFTER + 1)
            _, out = _relay(routing, trio.current_time())  # its core looks brokers over
            assert not _dialled(out) and routing.forgotten == [GONE]
            assert await backend.listener_urls(named) == first  # named again
            nursery.start_soon(backend._forget_brokers)
            for _ in range(int(SWEEP_EVERY // 30) + 1):
                clock.jump(30)
                await wait_all_tasks_blocked()
            assert routing.forgotten == []  # the sweep came
            assert routing.allowlist.allows(GONE) and not closed_listener(served[0])
            assert len(served) == 1
            nursery.cancel_scope.cancel()
        for listener in served:
            await listener.aclose()

    trio.run(test, clock=clock)


def test_a_lone_proxy_forgets_the_brokers_of_an_earlier_runs_ports_file(tmp_path: Path) -> None:
    """--broker-ports-file without workers: the brokers an earlier run gave
    ports are listened for again and count as learned at start, so an hour
    on, no answer naming them, they are forgotten: their listener closed,
    the file marking them forgotten for the next run. (They stayed allowed,
    their listeners open, for ever.)"""
    from trio.testing import MockClock, wait_all_tasks_blocked

    from sluice.brokers.embedded import free_port
    from sluice.proxy.dial import TlsClientConfig
    from sluice.proxy.pulsar import PulsarBackend
    from sluice.proxy.server import closed_listener

    port = free_port()
    kept = tmp_path / "broker-ports"
    kept.write_text(f"{port} 10.1.2.3 6650 plain\n")
    served: list[trio.abc.Listener[Any]] = []
    clock = MockClock()

    async def advance(seconds: float) -> None:
        for _ in range(int(seconds // 30)):
            clock.jump(30)
            await wait_all_tasks_blocked()

    async def test() -> None:
        journal = SharedBrokerPorts(kept, held=True)
        ports = BrokerPorts("127.0.0.1", None, None, journal, None, lambda lis, kind: lis)
        ports.serve = lambda listener, upstream, kind: served.append(listener)
        ports.map = Listeners()
        routing = Routing(parse_broker_url(BROKER))
        backend = PulsarBackend(
            parse_broker_url(BROKER),
            PulsarSettings(OnInvalid.REJECT, 5 << 20, 5),
            routing,
            broker_tls=TlsClientConfig(),
            connect_timeout=5,
            ports=ports,
        )
        async with trio.open_nursery() as nursery:
            await backend.listening(None)
            nursery.start_soon(backend._forget_brokers)
            assert routing.allowlist.allows(GONE) and len(served) == 1
            await advance(FORGET_AFTER * 0.75)
            assert routing.allowlist.allows(GONE) and not closed_listener(served[0])
            await advance(FORGET_AFTER * 0.5)
            assert not routing.allowlist.allows(GONE)
            assert closed_listener(served[0])
            nursery.cancel_scope.cancel()

    trio.run(test, clock=clock)
    assert kept.read_text().splitlines()[-1] == f"{port} 10.1.2.3 6650 plain forgotten"


def test_a_broker_another_worker_learned_is_kept_by_the_one_that_sees_it_named(
    tmp_path: Path,
) -> None:
    """Worker one learned a broker; from 45 minutes on only worker two sees
    it named. Two's first sighting wrote nothing (it was to tell the others
    half an hour later), so one forgot it at the hour: a lookup answered by
    two and the CONNECT on one was refused."""
    journal = tmp_path / "routes"
    journal.touch()
    one = SharedRouting(parse_broker_url(BROKER), journal)
    two = SharedRouting(parse_broker_url(BROKER), journal)
    try:
        _lookup(one, f"pulsar://{GONE}", 0.0)
        assert two.expire(1.0) == []  # two takes it in
        now = 45 * 60.0
        while now <= 80 * 60.0:
            _lookup(two, f"pulsar://{GONE}", now)
            assert one.expire(now) == [] and one.allowlist.knows(GONE), now
            now += 300.0
    finally:
        one.close()
        two.close()
