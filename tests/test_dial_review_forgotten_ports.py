"""--workers and port-per-broker: a broker every worker had forgotten and
that a lookup names again is learned again by every worker (the line in the
routes journal takes back every worker's forgetting, ``ForgottenRoutes``),
so its port must not be marked forgotten again until every worker has
forgotten it again: not on the say of the worker that named it alone,
counted with the other workers' forgetting from before. Two workers'
BrokerPorts on one journal in one process; no socket, no process."""

from __future__ import annotations

from pathlib import Path

import trio

from sluice.proxy.shared import create_state
from tests.test_forgetting_brokers_with_workers import GONE, _worker


def test_a_port_named_again_is_forgotten_only_once_every_worker_forgets_it_again(
    tmp_path: Path,
) -> None:
    create_state(tmp_path, 2)
    one, two = _worker(tmp_path, 0), _worker(tmp_path, 1)

    async def test() -> None:
        port = (await one.open(GONE)).port
        await one.forget(GONE)
        await two.forget(GONE)
        assert one.broker_of(port) is None and two.broker_of(port) is None
        # Named again, by an HTTP lookup on worker two: the same port, and
        # every worker takes the broker in again.
        assert (await two.open(GONE)).port == port
        assert one.broker_of(port) == (GONE, "plain")
        # Worker two forgets it again; worker one has not since it was named.
        await two.forget(GONE)
        assert one.broker_of(port) == (GONE, "plain")
        assert two.broker_of(port) == (GONE, "plain")
        await one.forget(GONE)  # now both have
        assert one.broker_of(port) is None and two.broker_of(port) is None

    try:
        trio.run(test)
    finally:
        for ports in (one, two):
            assert ports.journal is not None
            ports.journal.close()
