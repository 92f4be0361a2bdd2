"""Shared fixtures. Tests that need a real component start it here and fail,
never skip, when it is missing.

Two Pulsar brokers: ``broker`` is pulsar-lite (quick, no Java);
``apache_pulsar`` is Apache Pulsar itself, standalone, one per test session.
``any_broker`` runs a test once on each.

Tests that start processes are marked ``e2e`` here, from their fixtures
(``tests/helpers/tiers.py``); ``./dev test --fast`` runs the others."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sluice.brokers import Broker
from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.brokers.embedded import BrokerError, EmbeddedBroker
from tests.helpers.support import ProxyProcess, start_proxy
from tests.helpers.tiers import E2E_FIXTURES, GUARD

BROKERS = ["pulsar-lite", "apache-pulsar"]
pytest_plugins = ["tests.helpers.no_skips"]


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses a fixture of ``E2E_FIXTURES`` is end-to-end."""
    for item in items:
        if E2E_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _guarded(item):
        return (yield)


@contextlib.contextmanager
def _guarded(item: pytest.Item) -> Iterator[None]:
    """No process is started while a test that is not e2e sets up or runs
    (teardown may close session fixtures an e2e test opened)."""
    if item.get_closest_marker("e2e") is not None:
        yield
        return
    GUARD.running, GUARD.refused = item.nodeid, []
    try:
        yield
    finally:
        GUARD.running = None
    if GUARD.refused:
        pytest.fail(GUARD.refused[0], pytrace=False)


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """One real pulsar-lite broker for the whole test session."""
    with EmbeddedBroker() as b:
        yield b


# What the broker's log says when a port chosen for it was taken before it bound it.
PORT_TAKEN = "Address already in use"  # (Jetty's BindException, Netty's bind(..) failed)


def start_apache_pulsar(
    tmp: Path, make: Callable[[Path], ApachePulsar] | None = None, **options: object
) -> ApachePulsar:
    """An Apache Pulsar broker (``make(log_path)``, or one with ``options``),
    or a failed test that says why (never a skip).

    Its ports are chosen free when it is made and bound seconds later by the
    JVM: another process (beside a full run, other suites' clients and
    brokers) can take one first, and the broker exits with PORT_TAKEN. Then
    a new broker on new ports, twice at most; any other failure fails."""
    for attempt in range(3):
        log = tmp / ("apache-pulsar.log" if attempt == 0 else f"apache-pulsar-{attempt}.log")
        b = make(log) if make else ApachePulsar(log_path=log, **options)  # type: ignore[arg-type]
        try:
            return b.start()
        except BrokerError as exc:
            b.close()
            if attempt < 2 and log.exists() and PORT_TAKEN in log.read_text(errors="replace"):
                continue
            pytest.fail(f"Apache Pulsar could not be started: {exc}")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def apache_pulsar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApachePulsar]:
    """One Apache Pulsar standalone for the whole test session."""
    b = start_apache_pulsar(tmp_path_factory.mktemp("apache-pulsar"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def ws_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApachePulsar]:
    """Apache Pulsar with its WebSocket service on, for the modules that
    relay WebSocket sessions (one per module: it is stopped after them)."""
    b = start_apache_pulsar(
        tmp_path_factory.mktemp("ws-pulsar"), settings={"webSocketServiceEnabled": True}
    )
    yield b
    b.close()


@pytest.fixture(scope="session", params=BROKERS)
def any_broker(request: pytest.FixtureRequest) -> Broker:
    """The session's pulsar-lite, then the session's Apache Pulsar."""
    chosen: Broker = request.getfixturevalue(
        "broker" if request.param == "pulsar-lite" else "apache_pulsar"
    )
    return chosen


@pytest.fixture
def proxy(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[ProxyProcess]:
    """A `sluice proxy` process in front of the session broker."""
    p = start_proxy(broker.url, tmp_path)
    yield p
    p.kill()
    assert "Traceback" not in p.log(), p.log()


@pytest.fixture
def any_proxy(any_broker: Broker, tmp_path: Path) -> Iterator[ProxyProcess]:
    """A `sluice proxy` process in front of ``any_broker``."""
    p = start_proxy(any_broker.url, tmp_path)
    yield p
    p.kill()
    assert "Traceback" not in p.log(), p.log()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")
    return f"persistent://public/default/{name}-{uuid.uuid4().hex[:8]}"
