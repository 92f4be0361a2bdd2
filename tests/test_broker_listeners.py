"""A lone proxy's per-broker listeners (``BrokerPorts``) as lookups ask for
them: one listener per broker, however many ask at once, and a port range
that cannot be used for another reason than its brokers said as that
reason. In-process: real sockets on loopback, no broker."""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from sluice.addresses import Address
from sluice.proxy.ports import BrokerPorts, Listeners, NoListener
from sluice.proxy.shared import SharedBrokerPorts


def _ports(
    served: list[tuple[trio.abc.Listener[Any], Address]],
    span: tuple[int, int] | None = None,
    journal: SharedBrokerPorts | None = None,
) -> BrokerPorts:
    ports = BrokerPorts("127.0.0.1", None, span, journal, None, lambda listener, kind: listener)
    ports.map = Listeners()
    ports.serve = lambda listener, upstream, kind: served.append((listener, upstream))
    return ports


def _run(test: Callable[[], Any]) -> None:
    trio.run(test)


async def _close(served: list[tuple[trio.abc.Listener[Any], Address]]) -> None:
    for listener, _ in served:
        await listener.aclose()


def test_lookups_asking_at_once_for_one_broker_get_one_listener(tmp_path: Path) -> None:
    """Clients reconnecting together (a restart) look the same broker up at
    the same moment: one listener, one journal line, every lookup told it."""
    journal = SharedBrokerPorts(tmp_path / "ports", held=True)
    served: list[tuple[trio.abc.Listener[Any], Address]] = []

    async def test() -> None:
        ports = _ports(served, journal=journal)
        told: list[Address] = []

        async def ask() -> None:
            told.append(await ports.open(Address("broker-1", 6650)))

        try:
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(ask)
            assert len(served) == 1, [listener for listener, _ in served]
            assert len(set(told)) == 1 and len(told) == 5
            lines = (tmp_path / "ports").read_text().splitlines()
            assert len(lines) == 1, lines
        finally:
            await _close(served)

    try:
        _run(test)
    finally:
        journal.close()


def test_one_broker_spelled_several_ways_has_one_listener(tmp_path: Path) -> None:
    """Host names are the same in any case and with a trailing dot (DNS);
    an IPv6 address is one however it is written. A broker answers name
    it either way: one listener (and journal line) each, and the main
    listener's broker is not given a second."""
    journal = SharedBrokerPorts(tmp_path / "ports", held=True)
    served: list[tuple[trio.abc.Listener[Any], Address]] = []
    spellings = {
        "broker-1": ["broker-1", "Broker-1", "broker-1.", "BROKER-1."],
        "::1": ["::1", "[::1]", "0:0::1", "0000:0000:0000:0000:0000:0000:0000:0001"],
    }

    async def test() -> None:
        ports = _ports(served, journal=journal)
        ports.stands_for(Address("main.example", 6650), 7777)  # the main listener
        try:
            for names in spellings.values():
                told = {await ports.open(Address(name, 6650)) for name in names}
                assert len(told) == 1, told
            assert len(served) == 2, [upstream for _, upstream in served]
            assert await ports.open(Address("Main.Example.", 6650)) == Address("127.0.0.1", 7777)
            assert len(served) == 2
            lines = (tmp_path / "ports").read_text().splitlines()
            assert len(lines) == 2, lines
        finally:
            await _close(served)

    try:
        _run(test)
    finally:
        journal.close()


def test_a_range_that_cannot_be_listened_on_says_why_not_that_it_is_full() -> None:
    """Out of file descriptors (a proxy over its ulimit -n), no port of
    --listener-ports can be bound: the lookup is told that, not that every
    port has a broker (which would have the range widened, in vain)."""
    served: list[tuple[trio.abc.Listener[Any], Address]] = []

    async def test() -> None:
        ports = _ports(served, span=(20000, 20009))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        filler: list[int] = []
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
        try:
            with pytest.raises((NoListener, OSError)) as caught:
                while True:  # every descriptor taken
                    try:
                        filler.append(os.open(os.devnull, os.O_RDONLY))
                    except OSError as exc:
                        assert exc.errno == errno.EMFILE
                        break
                await ports.open(Address("broker-1", 6650))
        finally:
            for fd in filler:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            await _close(served)
        assert "no free port" not in str(caught.value)
        assert os.strerror(errno.EMFILE) in str(caught.value)

    _run(test)
