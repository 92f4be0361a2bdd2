"""``--workers``: what happens while a worker is being started (at the
proxy's start, or restarted after it died): a reload, a drain."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
from pathlib import Path

import pytest
import trio
import trio.testing
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from sluice.addresses import Address
from sluice.brokers.embedded import free_port
from sluice.protocols import registry
from sluice.protocols.faults import parse_rule
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.shared import create_state
from sluice.proxy.workers import Supervisor, http

pytestmark = pytest.mark.e2e


async def test_a_reload_while_the_workers_start_kills_none() -> None:
    """The supervisor's SIGHUP reaches a worker still starting Python (before
    it can take the signal): it is not killed by it (it was, its default
    action, and the reload was refused naming it restarted); it takes the
    reload once it runs, and every worker runs the new generation."""
    broker = parse_broker_url(f"pulsar://127.0.0.1:{free_port()}")
    config = ProxyConfig(broker=broker, listen=Address("127.0.0.1", 0), drain_timeout=1)
    new = config.replace(max_connections=77)
    supervisor = Supervisor(config, 2, log_level="warning", load=lambda: new)
    await supervisor.open()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            with trio.fail_after(15):  # (a few seconds unloaded)
                while not all(w.running for w in supervisor.workers):
                    await trio.sleep(0.001)
                outcome = await supervisor.reload_from_source("SIGHUP")
            assert outcome.outcome == "applied", outcome.summary()
            assert outcome.generation.number == 2
            assert [w.restarts for w in supervisor.workers] == [0, 0]
            supervisor.stop()
    finally:
        supervisor.stop()


async def test_a_worker_being_started_when_the_drain_begins_is_stopped_at_once() -> None:
    """SIGTERM while a worker is being (re)started, its process being made
    in a thread: the process never serves (it served the inherited
    listeners, never told to drain, until killed at the drain's end)."""
    broker = parse_broker_url(f"pulsar://127.0.0.1:{free_port()}")
    config = ProxyConfig(broker=broker, listen=Address("127.0.0.1", 0), drain_timeout=1)
    supervisor = Supervisor(config, 1, log_level="warning")
    await supervisor.open()
    worker = supervisor.workers[0]
    codes: list[int] = []
    # The process is made in one of trio's threads: with every thread
    # taken, it waits for one, to be made once the drain has begun.
    threads = trio.to_thread.current_default_thread_limiter()
    holders: list[object] = []
    try:
        create_state(supervisor._state, 1)

        async def start() -> None:
            codes.append(await supervisor._run_worker(worker))

        for _ in range(int(threads.total_tokens)):
            holders.append(object())
            await threads.acquire_on_behalf_of(holders[-1])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(start)
            await trio.testing.wait_all_tasks_blocked()
            assert worker.process is None
            nursery.start_soon(supervisor.drain)
            await trio.testing.wait_all_tasks_blocked()
            for holder in holders:
                threads.release_on_behalf_of(holder)
            holders = []
            with trio.fail_after(15):  # (well under a second unloaded)
                while not codes:
                    await trio.sleep(0.01)
        assert codes == [-signal.SIGKILL]
    finally:
        for holder in holders:
            threads.release_on_behalf_of(holder)
        if worker.process is not None and worker.process.returncode is None:
            worker.process.kill()
        shutil.rmtree(supervisor._state, ignore_errors=True)


async def test_a_worker_killed_before_it_reads_its_settings_is_restarted() -> None:
    """A worker killed (by the OOM killer, say) while the supervisor still
    writes it its settings (more than a pipe holds: a long --allow-broker)
    is restarted, as any worker that dies. (The supervisor failed, with a
    traceback, and its other workers with it.)"""
    broker = parse_broker_url(f"pulsar://127.0.0.1:{free_port()}")
    allow = tuple(f"broker-{i}.example.com:6650" for i in range(4000))
    config = ProxyConfig(
        broker=broker, listen=Address("127.0.0.1", 0), drain_timeout=1, allow_broker=allow
    )
    assert len(pickle.dumps(config)) > 65536  # Linux's pipe holds 64 KiB
    supervisor = Supervisor(config, 1, log_level="warning")
    await supervisor.open()
    worker = supervisor.workers[0]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            with trio.fail_after(15):  # (a few seconds unloaded)
                while worker.process is None:
                    await trio.sleep(0.001)
                first = worker.process
                os.kill(first.pid, signal.SIGKILL)  # still starting Python
                while worker.process is first or not worker.said_ready:
                    await trio.sleep(0.01)
            assert worker.restarts == 1
            supervisor.stop()
    finally:
        supervisor.stop()


async def test_a_worker_that_cannot_start_says_why_in_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A key file gone since the supervisor checked it (a Secret deleted,
    say): each start of the worker fails with one line naming the file
    (it was a Python traceback each time), and it is restarted after a
    pause."""
    key = tmp_path / "public.pem"
    private = ec.generate_private_key(ec.SECP256R1())
    key.write_bytes(
        private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    (tmp_path / "token").write_text("sluice-token")
    broker = parse_broker_url(f"pulsar://127.0.0.1:{free_port()}")
    config = ProxyConfig(
        broker=broker, listen=Address("127.0.0.1", 0), drain_timeout=1, auth_mode="proxy",
        auth_token_public_key=key, broker_auth_token_file=tmp_path / "token",
    )  # fmt: skip
    key.unlink()
    supervisor = Supervisor(config, 1, log_level="warning")
    await supervisor.open()
    worker = supervisor.workers[0]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            with trio.fail_after(15):  # (a few seconds unloaded)
                while worker.restarts < 1:
                    await trio.sleep(0.01)
            supervisor.stop()
    finally:
        supervisor.stop()
    err = capfd.readouterr().err
    assert f"worker 0 cannot start: --auth-token-public-key {key}: No such file" in err, err
    assert "Traceback" not in err, err


async def _cut_after_commit(nursery: trio.Nursery, supervisor: Supervisor, decisions: Path) -> None:
    """Start a reload and cut it short (as the admin endpoint's time limit
    does) once the workers were told to commit it."""
    cut = trio.CancelScope()

    async def reload() -> None:
        with cut:
            await supervisor.reload_from_source("admin")

    nursery.start_soon(reload)
    while not decisions.exists() or "commit" not in decisions.read_text():
        await trio.sleep(0.002)
    cut.cancel()


async def test_a_reload_after_one_cut_short_once_committed_is_put_in_force() -> None:
    """A reload cut short once every worker was told to put it in force
    (the admin endpoint's time limit, say): the next reload is put in force
    by the workers. (It was numbered as the one cut short, which the
    workers ran already: they left it alone, the supervisor waited a
    minute for them and refused it, and every later reload alike.)"""
    broker = parse_broker_url(f"pulsar://127.0.0.1:{free_port()}")
    config = ProxyConfig(broker=broker, listen=Address("127.0.0.1", 0), drain_timeout=1)
    settings = [config.replace(max_connections=50)]
    supervisor = Supervisor(config, 1, log_level="warning", load=lambda: settings[0])
    await supervisor.open()
    address = supervisor.addresses["plain"]
    decisions = supervisor._state / "reload-decisions"
    clients = [socket.socket(), socket.socket()]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            with trio.fail_after(15):  # (a few seconds unloaded)
                while not supervisor.workers[0].said_ready:
                    await trio.sleep(0.01)
                await _cut_after_commit(nursery, supervisor, decisions)
                settings[0] = config.replace(max_connections=1)
                outcome = await supervisor.reload_from_source("admin")
                assert outcome.outcome == "applied", outcome.summary()
                # In force in the worker: one connection, and the next refused.
                clients[0].connect((address.host, address.port))
                clients[1].connect((address.host, address.port))
                clients[1].setblocking(False)
                while True:
                    try:
                        if clients[1].recv(1) == b"":
                            break
                    except BlockingIOError:
                        pass
                    except ConnectionResetError:
                        break
                    await trio.sleep(0.01)
            supervisor.stop()
    finally:
        for c in clients:
            c.close()
        supervisor.stop()


async def test_fault_rules_of_a_reload_cut_short_reach_the_workers_with_the_next() -> None:
    """With --admin the supervisor gives the workers the rules of the
    configuration: a reload cut short once committed, before it had given
    them, has the next reload give them. (They were never given: the next
    reload saw no change of rules.)"""
    broker = parse_broker_url(f"pulsar://127.0.0.1:{free_port()}")
    config = ProxyConfig(broker=broker, listen=Address("127.0.0.1", 0),
                         admin=Address("127.0.0.1", 0), drain_timeout=1)  # fmt: skip
    rule = parse_rule({"id": "r1", "match": {"command": "SEND_RECEIPT"}, "action": "delay",
                       "delay_ms": 10}, registry.all_faults())  # fmt: skip
    settings = [config.replace(faults=(rule,))]
    supervisor = Supervisor(config, 1, log_level="warning", load=lambda: settings[0])
    await supervisor.open()
    decisions = supervisor._state / "reload-decisions"
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            with trio.fail_after(15):  # (a few seconds unloaded)
                while not supervisor.workers[0].admin:
                    await trio.sleep(0.01)
                await _cut_after_commit(nursery, supervisor, decisions)
                settings[0] = settings[0].replace(max_connections=7)
                outcome = await supervisor.reload_from_source("admin")
                assert outcome.outcome == "applied", outcome.summary()
                admin = supervisor.workers[0].admin
                assert admin is not None
                status, body = await http(admin, "GET", "/faults")
            assert status == 200
            assert [r["id"] for r in json.loads(body)["rules"]] == ["r1"]
            assert [r["id"] for r in supervisor.rules] == ["r1"]
            supervisor.stop()
    finally:
        supervisor.stop()
