"""A port Sluice cannot listen on is one line naming the flag that asked
for it and its address: ``sluice proxy`` alone and with ``--workers``, and
``sluice demo`` with its own flags (``--port``, ``--admin-port``)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from sluice.brokers.embedded import EmbeddedBroker, free_port
from tests.test_proxy_e2e import run_cli


@pytest.fixture
def busy() -> Iterator[int]:
    """A loopback port this test listens on."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def one_line(*args: str) -> str:
    result = run_cli(*args, timeout=120)
    # (The demo says what it starts on lines of its own.)
    lines = [x for x in result.stderr.strip().splitlines() if not x.startswith("[demo] ")]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("flag", ["--listen", "--admin", "--http-listen"])
def test_the_busy_port_is_named_by_its_flag(
    broker: EmbeddedBroker, busy: int, flag: str, workers: str
) -> None:
    ports = {f: f"127.0.0.1:{free_port()}" for f in ("--listen", "--admin", "--http-listen")}
    ports[flag] = f"127.0.0.1:{busy}"
    # (Pulsar with --workers and --http-listen needs --listener-ports.)
    line = one_line(
        "proxy", "--broker", broker.url, "--workers", workers, "--broker-http",
        "http://127.0.0.1:1", *(["--listener-ports", _range()] if workers != "1" else []),
        *(part for f, a in ports.items() for part in (f, a)),
    )  # fmt: skip
    assert line.endswith(f"cannot listen on 127.0.0.1:{busy} ({flag}): address already in use")


def _range() -> str:
    low = free_port()
    return f"{low}-{low}"


@pytest.mark.e2e
@pytest.mark.parametrize("flag", ["--port", "--admin-port"])
def test_the_demo_names_its_own_flag(busy: int, flag: str) -> None:
    other = "--admin-port" if flag == "--port" else "--port"
    line = one_line("demo", "--messages", "2", flag, str(busy), other, str(free_port()))
    assert (
        line == f"sluice demo: cannot listen on 127.0.0.1:{busy} ({flag}): address already in use"
    )
