"""``sluice proxy --workers N``: N worker processes serving the same ports.

One Python process saturates one core, so a busy proxy runs several. The
*supervisor* (the process the user started) binds the listening sockets and
starts N *workers* (this module's ``main`` in a new Python, started by
``hangup.WORKER_COMMAND``, which ignores SIGHUP first), each a complete
shared-nothing trio proxy (``Proxy`` with a ``WorkerRole``) that inherits the
listening sockets and accepts from them: the kernel hands each new
connection to a worker that is waiting in ``accept``, so busy workers take
fewer. (``SO_REUSEPORT`` would instead hash connections onto workers
whatever their load, and a dying worker would take the connections queued on
its own socket with it; one shared socket loses none.)

What must look like one proxy does:

- Lookups and ``proxy_to_broker_url`` CONNECTs on different workers, and the
  connection limits as totals: ``sluice.proxy.shared``.
- The admin endpoint is the supervisor's: ``/metrics`` is the sum over the
  workers (each serves its own on a private loopback port, only when
  ``--admin`` is given), ``/readyz`` is ready when every worker is,
  ``/faults`` changes every worker's rules (the supervisor keeps the rule
  set and gives it to workers it restarts). Without ``--admin`` no process
  opens an admin port, and workers get the ``--faults`` rules with their
  configuration.
- A worker that hangs while serving (answers no readiness check for
  ``HUNG_AFTER`` and ``HUNG_MISSES`` in a row) is killed and restarted.
  Behind ``--admin`` a check is a GET of the worker's /readyz; without,
  the supervisor asks over the pipes it holds anyway: a byte on the
  worker's stdin (``_PING``), which the worker's trio loop answers on its
  stdout (``_PONG``). Either way a worker whose loop is stuck answers none.
- A worker that dies is restarted (``sluice_worker_restarts_total``), with a
  growing pause if it keeps dying at once; when no worker has ever started,
  the supervisor gives up after ``START_TRIES`` each, with exit code 1.
  SIGTERM drains every worker within ``--drain-timeout``; a second signal
  tells each to stop at once (closing its connections and recording), and
  kills one that has not within ``STOP_GRACE``.
- A worker never outlives the supervisor. The supervisor keeps the write end
  of the worker's stdin open for the worker's whole life and never writes to
  it after the start; when the supervisor dies, by SIGKILL too, the kernel
  closes it, and the worker reads end-of-file, closes its listeners at once
  and drains. (A parent-death signal would be the other Linux way, but it
  follows the thread that started the child, and trio starts processes from
  a worker thread that may end long before the supervisor does.) As a
  fallback the worker also checks once a second that its parent is still
  the supervisor.
- Recording: each worker writes its own capture (segment files) into the
  same directory; readers take a directory's captures as one recording, and
  connection ids are unique across workers.
- Port-per-broker listeners (``ports.py``): the supervisor binds all of
  ``--listener-ports`` at start and every worker accepts on them; which
  port stands for which broker is in ``SharedBrokerPorts``.
- The HTTP listener (``--http-listen``): the supervisor binds it, every
  worker serves it; the per-broker listeners its lookups name are the
  ``--listener-ports`` ones above.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import pickle
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from sluice.addresses import Address
from sluice.errors import ConfigError
from sluice.logs import setup_logging
from sluice.protocols import registry
from sluice.protocols.faults import FaultError, check_room, parse_rule
from sluice.protocols.haproxy import HeaderError
from sluice.proxy import hangup
from sluice.proxy.admin import (
    RELOAD_TIME,
    SNAPSHOT_TIME,
    AdminRequest,
    ConfigEndpoint,
    Handler,
    Limited,
    Refused,
    SnapshotRequest,
    authorize,
    bound,
    fault_id,
    json_body,
    open_admin,
    rule_path,
    serve_admin,
)
from sluice.proxy.allocator import keep_big_buffers
from sluice.proxy.config import ProxyConfig, listening_for, proxy_protocol_in
from sluice.proxy.dial import bind_all
from sluice.proxy.http import HTTP, HTTPS
from sluice.proxy.live import parse_after
from sluice.proxy.metrics import REFUSED_HELP, RELOAD_OUTCOMES
from sluice.proxy.ports import BROKER, BrokerPorts, bind_range
from sluice.proxy.reload import (
    FILES,
    Generation,
    Outcome,
    effective,
    files,
    flags,
    read_again,
    split,
    watched,
)
from sluice.proxy.server import (
    Proxy,
    WorkerRole,
    prepare_time,
    reload_when_asked,
    serve_until_signalled,
)
from sluice.proxy.shared import (
    BROKER_PORTS_LOCK,
    BROKER_PORTS_VOTES,
    HTTP_LIMITS_FILE,
    LIMITS_FILE,
    MARK_EVERY,
    ROUTES_FILE,
    ForgottenRoutes,
    Journal,
    clear_row,
    create_state,
    hold_ports_file,
    learned_from_ports_file,
    mark_time,
    stop_giving_ports,
)
from sluice.recording.writer import snapshot_name

log = logging.getLogger("sluice.workers")

# How long a scrape of the supervisor's /metrics waits for each worker's.
SCRAPE_TIMEOUT = 2.0
# How long a worker may take to start listening before it counts as failed.
START_TIMEOUT = 60.0
# A worker that has answered none of its readiness checks for this long is
# hung (stuck in a loop, stopped, deadlocked): it is killed and restarted,
# as one that did not finish draining in time is killed. As long as a
# worker may take to start: a pause of a loaded machine is not a hang.
HUNG_AFTER = START_TIMEOUT
# ... and has missed this many checks in a row besides: one check that
# spanned a pause of the whole machine (trio's clock runs on through it)
# is no hang, the next is answered.
HUNG_MISSES = 5
# A worker that dies sooner than this after starting is restarted after a
# pause that doubles each time (up to MAX_BACKOFF); one that ran longer at once.
STABLE_AFTER = 10.0
MAX_BACKOFF = 30.0
# Until a worker has said it is ready once, this many failed starts of each
# worker (all of them, together) end the proxy: one that cannot start is to
# say so and exit, as a lone proxy does, not hold the port with none to serve.
START_TRIES = 3
# Stopping at once (a second signal): how long a worker told to stop may
# take to close its connections and recording before it is killed.
STOP_GRACE = 3.0
# How often a worker checks that its parent is still the supervisor (the
# fallback; the end-of-file on its stdin is seen at once).
SUPERVISOR_CHECK = 1.0
# While starting, how often the supervisor asks the workers' /readyz
# (afterwards, every READINESS_INTERVAL).
READINESS_INTERVAL = 1.0
STARTING_READINESS_INTERVAL = 0.2
# The worker's spec on its stdin: its length, then the pickle.
_SPEC_LENGTH = struct.Struct(">Q")
# Gauges that are the same in every worker or whose sum means nothing.
_GAUGE_MIN = {"sluice_upstream_up"}
_GAUGE_MAX = {"sluice_build_info"}
# Families the supervisor serves for all: the workers' own are left out.
_SUPERVISORS = {
    "sluice_config_reloads",
    "sluice_config_generation",
    "sluice_config_loaded_timestamp_seconds",
    "sluice_config_refused_timestamp_seconds",
}
# A reload, in two steps: the configuration every worker is to take (the
# attempt's number, its generation, where it came from, the ProxyConfig);
# each worker's report of it (made ready or refused, then put in force);
# and the supervisor's decision, a line per attempt ("N commit" or "N
# abort"), put in force by every worker only once every worker could.
RELOAD_FILE = "reload.pickle"
RELOAD_REPORT = "reload-{index}.json"
RELOAD_DECISIONS = "reload-decisions"
COMMIT, ABORT = "commit", "abort"
# How long the supervisor waits, once every worker made a reload ready
# (which takes at most ``prepare_time``), for each to report it in force:
# a worker puts it in force as it reads the decision, nothing fetched.
DONE_TIMEOUT = 10.0
# Besides a reload's steps: the fault rules handed to the workers.
RULES_TIME = 20.0


def ready_timeout(config: ProxyConfig) -> float:
    """How long the supervisor waits for every worker to report a reload
    made ready (or refused) before aborting it: the worst case of making
    one ready, and the signal and reports besides."""
    return prepare_time(config) + DONE_TIMEOUT


def decision_timeout(config: ProxyConfig) -> float:
    """How long a worker that made a reload ready waits for the decision:
    longer than the supervisor waits for the reports, so that the decision,
    commit or abort, always reaches it."""
    return ready_timeout(config) + DONE_TIMEOUT


def available_cpus() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup CPU quota
    (a Kubernetes pod's CPU limit)."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        count = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def _cgroup_quota() -> float | None:
    try:  # cgroup v2: "max 100000" or "200000 100000"
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


@dataclass
class WorkerSpec:
    """What a worker process is given on its stdin (pickled): never argv, so
    that the admin token does not show in ps."""

    config: ProxyConfig
    index: int
    count: int
    state: Path
    kinds: list[str]  # listener kinds, in the order of ``fds``
    fds: list[int]
    log_level: str
    log_format: str
    generation: int = 1  # the configuration generation ``config`` is
    # Files given as a private copy (``Supervisor._pinned``): by setting,
    # the file the configuration names and the copy ``config`` names.
    pinned: dict[str, tuple[Path, Path]] = field(default_factory=dict)


@dataclass
class Worker:
    """The supervisor's view of one worker."""

    index: int
    process: trio.Process | None = None
    admin: Address | None = None
    restarts: int = 0
    # Its starts that failed, before any worker had said it is ready.
    failed_starts: int = 0
    # The worker's own /readyz at the supervisor's last look: None before
    # the first look since it (re)started, "" ready, else why not.
    problem: str | None = None
    # Since when (trio's clock) its readiness checks have gone unanswered
    # (None: it answered the last, or none was asked of it yet).
    silent_since: float | None = None
    # Its checks in a row that got no answer in time, and what a check still
    # waiting for its answer asked (a late one is an answer too).
    misses: int = 0
    asking: Address | trio.Process | None = None
    # Without an admin port (no --admin): it has said it is ready, and its
    # stdout is read for the answers to the checks sent on its stdin.
    piped: bool = False
    # Set when the worker answers the check sent on its stdin (``_PING``).
    pong: trio.Event = field(default_factory=trio.Event)
    # The process said it is ready: it takes SIGHUP from then on (before,
    # while Python starts, SIGHUP's default action would end it).
    said_ready: bool = False
    # Writing to its stdin: its settings, then the word to drain (_DRAIN).
    writing: trio.Lock = field(default_factory=trio.Lock)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def ready(self) -> bool:
        return self.running and self.admin is not None

    @property
    def checked(self) -> Address | trio.Process | None:
        """What its readiness checks ask: its private admin endpoint, or,
        without one, its process over its pipes (None: not yet asked)."""
        if self.admin is not None:
            return self.admin
        return self.process if self.piped else None


class _NotStarted(Exception):
    """A worker's process could not be made (``cause``)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass
class Supervisor:
    config: ProxyConfig
    count: int
    log_level: str = "info"
    log_format: str = "text"
    workers: list[Worker] = field(default_factory=list)
    addresses: dict[str, Address] = field(default_factory=dict)
    draining: bool = False
    # Every worker has been ready at once (the end of the start).
    started: bool = False
    # Reading the settings again (None: no reloads).
    load: Callable[[], ProxyConfig] | None = None

    def __post_init__(self) -> None:
        # What the key files held at start (reload.FILES): their contents,
        # kept for a worker restarted later, and their digests.
        contents, self._held = _read_files(self.config)
        self.workers = [Worker(i) for i in range(self.count)]
        self.registry = CollectorRegistry()
        self.restarts = Counter("sluice_worker_restarts", "Worker processes restarted after dying",
                                registry=self.registry)  # fmt: skip
        self.running = Gauge("sluice_workers", "Worker processes by state", ["state"],
                             registry=self.registry)  # fmt: skip
        self.running.labels("ready").set_function(lambda: sum(w.ready for w in self.workers))
        self.running.labels("configured").set(self.count)
        # Workers' admin calls (faults) carry this token: the user's, or one
        # made up for this run when the user gave none.
        self.token = self.config.admin_token or secrets.token_hex(16)
        # The rule set, as given to every worker (ids assigned here).
        self.rules: list[dict[str, Any]] = [r.definition() for r in self.config.faults]
        self._rule_ids = 0
        self._totals = _Totals()
        self._rule_totals = _Totals()  # the fault rules' hits and seen, alike
        # Scrapes numbered as they are asked for: of two at once, the one
        # asked first may end last (_Totals.scraped leaves its answers out).
        self._scrapes = itertools.count()
        self._sockets: list[tuple[str, socket.socket]] = []
        self._spawning = 0  # workers' processes being made (in threads)
        self._admin: list[trio.SocketListener] | None = None
        self._ports_file: int | None = None  # --broker-ports-file, locked (hold_ports_file)
        self._state = Path(tempfile.mkdtemp(prefix="sluice-workers-"))
        self._stopped = trio.Event()
        self._killed: set[int] = set()  # workers' pids killed by ``stop`` (said once)
        # Stopping at once (``stop``): when the workers told must have exited.
        self._stop_by: float | None = None
        # A worker has said it is ready (no failed start counts from then on).
        self._ever_ready = False
        # Why the supervisor stopped of itself (no worker could start).
        self.gave_up: str | None = None
        self._given_up = trio.Event()
        self._snapshotting = False
        # Configuration reloads: the generation every worker runs.
        self.generation = Generation(1, time.time(), "start")
        # What a worker started now starts with: the configuration and its
        # generation's number, set as a reload is committed.
        self._in_force = (self.config, 1, contents)
        # The configuration whose fault rules the workers were given last
        # (with --admin: theirs carries none).
        self._ruled = self.config
        self._reloading = trio.Lock()
        # A reload waits for the workers to make it ready: a worker that says
        # it is ready meanwhile is sent its SIGHUP then.
        self._hup_pending = False
        self._attempts = itertools.count(1)  # reloads tried, numbered for the workers
        # Its own, as a lone proxy serves them (with the protocol label):
        # the workers' are left out of the sum.
        protocol = self.config.protocol
        self._reloads = Counter(
            "sluice_config_reloads", "Configuration reloads, by outcome (applied, unchanged, "
            "refused)", ["protocol", "outcome"], registry=self.registry,
        )  # fmt: skip
        for outcome in RELOAD_OUTCOMES:  # at zero, so the first refusal alerts
            self._reloads.labels(protocol, outcome)
        self._generation = Gauge(
            "sluice_config_generation", "The configuration generation every worker runs "
            "(1 at start)", ["protocol"], registry=self.registry,
        ).labels(protocol)  # fmt: skip
        self._loaded = Gauge(
            "sluice_config_loaded_timestamp_seconds", "When the configuration in force was "
            "loaded (Unix time)", ["protocol"], registry=self.registry,
        ).labels(protocol)  # fmt: skip
        self._refused = Gauge(
            "sluice_config_refused_timestamp_seconds", REFUSED_HELP, ["protocol"],
            registry=self.registry,
        ).labels(protocol)  # fmt: skip
        self._generation.set(1)
        self._loaded.set(self.generation.loaded_at)

    # --- lifecycle ------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the workers and keep them running until ``drain``."""
        try:
            admin = self._admin
            create_state(self._state, self.count)
            config = self.config
            if config.broker_ports_file is not None:
                # Learned, so forgotten unless named again (or never, as
                # no lookup of this run named them).
                learned_from_ports_file(self._state, config.broker_ports_file,
                                        config.listener_ports, config.broker.tls)  # fmt: skip
            mark_time(self._state)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._mark_time)
                for worker in self.workers:
                    nursery.start_soon(self._keep_running, worker)
                # With --admin or without: a hung worker is killed either way.
                nursery.start_soon(self._watch_readiness)
                if admin is not None:
                    routes: dict[str, Handler] = {
                        "/faults": self.faults,
                        # (each worker has SNAPSHOT_TIME to write its part)
                        "/recording": Limited(self.snapshot, SNAPSHOT_TIME + DONE_TIMEOUT),
                        "/live": self.live,
                        "/config": ConfigEndpoint(
                            lambda: self.generation.to_json(), self._reload_json,
                            self.config.admin_token,
                            time_limit=max(RELOAD_TIME, ready_timeout(self.config)
                                           + DONE_TIMEOUT + RULES_TIME),
                        ),
                    }  # fmt: skip
                    nursery.start_soon(functools.partial(
                        serve_admin, admin, self.registry, self.readiness, routes, self.metrics,
                        inbound=proxy_protocol_in(self.config), refused=_admin_refused,
                    ))  # fmt: skip
                # Started at once: SIGTERM must reach the drain from now on.
                # The listeners queue connections until a worker takes them.
                task_status.started(self)
                await self._stopped.wait()
                nursery.cancel_scope.cancel()
        finally:
            for _, sock in self._sockets:
                sock.close()
            shutil.rmtree(self._state, ignore_errors=True)

    async def _mark_time(self) -> None:
        """The routes journal dated every ``MARK_EVERY``, for workers
        started later (``share_forgetting``)."""
        while True:
            await trio.sleep(MARK_EVERY)
            with contextlib.suppress(OSError):  # (the state let go: stopping)
                mark_time(self._state)

    async def open(self) -> None:
        """Bind the admin endpoint and the listeners (OSError: e.g. a port in
        use), before anything starts, so that the error is plain; what was
        bound, and the state directory, are let go then (nothing runs)."""
        try:
            if self.config.broker_ports_file is not None:  # this proxy's alone, for its life
                self._ports_file = hold_ports_file(self.config.broker_ports_file)
            if self.config.admin is not None:
                with listening_for("--admin", self.config.admin):
                    self._admin = await open_admin(self.config.admin)
                self.addresses["admin"] = bound(self._admin)
            self._bind()
        except BaseException:
            if self._ports_file is not None:
                os.close(self._ports_file)
            for _, sock in self._sockets:
                sock.close()
            if self._admin is not None:
                for listener in self._admin:
                    await listener.aclose()
            shutil.rmtree(self._state, ignore_errors=True)
            raise

    def _bind(self) -> None:
        config = self.config
        for kind, flag, address in (("plain", "--listen", config.listen),
                                    ("tls", "--listen-tls", config.listen_tls)):  # fmt: skip
            if address is None:
                continue
            with listening_for(flag, address):
                sockets = bind_all(address)
            for sock in sockets:
                sock.set_inheritable(True)
                self._sockets.append((kind, sock))
                host, port = sock.getsockname()[:2]
                self.addresses.setdefault(kind, Address(host, port))
        http = config.http_listen, config.http_listen_tls
        for kind, flag, address in ((HTTP, "--http-listen", http[0]),
                                    (HTTPS, "--http-listen-tls", http[1])):  # fmt: skip
            if address is None:
                continue
            with listening_for(flag, address):
                sockets = bind_all(address)
            for sock in sockets:
                sock.set_inheritable(True)
                self._sockets.append((kind, sock))
                host, port = sock.getsockname()[:2]
                self.addresses.setdefault(kind, Address(host, port))
        if registry.get(config.protocol).port_per_broker and config.listener_ports:
            for sock in bind_range(config.main_listen.host, *config.listener_ports):
                sock.set_inheritable(True)
                self._sockets.append((BROKER, sock))

    async def drain(self) -> None:
        """SIGTERM every worker (each drains its connections), then wait for
        them, killing any still running after the drain timeout."""
        self.draining = True
        deadline = trio.current_time() + self.config.drain_timeout + 5
        log.info("draining %d workers (timeout %gs)", self.count, self.config.drain_timeout)
        # Told on stdin, not by a signal: a service manager or terminal that
        # signals every process of the proxy at once (systemd's stop, Ctrl-C)
        # has signalled them already, and a second signal stops at once.
        with trio.move_on_at(deadline):  # (one still reading its settings waits)
            async with trio.open_nursery() as nursery:
                for worker in self.workers:
                    if worker.running:
                        assert worker.process is not None
                        nursery.start_soon(_tell_drain, worker, worker.process)
        # Stop accepting: a worker's drain closes only its copy of each
        # listener, and this one kept the port bound and taking connections
        # that nobody would accept (until the end of the drain). Not under a
        # worker's process being made (it is stopped once made: _run_worker).
        while self._spawning:
            await trio.sleep(0.005)
        for _, sock in self._sockets:
            sock.close()
        if self._ports_file is not None:  # for a proxy started in this one's place
            stop_giving_ports(self._state / BROKER_PORTS_LOCK)
            os.close(self._ports_file)
            self._ports_file = None
            log.info("--broker-ports-file %s let go: no broker is given a port while "
                     "draining", self.config.broker_ports_file)  # fmt: skip
        with trio.move_on_at(deadline):
            while any(w.running for w in self.workers):
                await trio.sleep(0.05)
        waited = self.config.drain_timeout + 5
        self._kill(f"did not finish draining within {waited:g}s")
        self._stopped.set()

    def stop(self) -> None:
        """Stop at once (a second signal): every worker is told to stop
        at once, as a lone proxy's second signal does (its connections
        closed, its recording closed, not lost), and killed if it has not
        within ``STOP_GRACE`` (``_run_worker``); one that cannot be told now
        is killed at once."""
        if self._stop_by is None:
            self._stop_by = trio.current_time() + STOP_GRACE
        for worker in self.workers:
            if worker.running and not _tell_stop(worker):
                self._kill_one(worker, "a second signal, stopping now")
        self._stopped.set()

    def _kill(self, why: str) -> None:
        """Kill every worker still running, each named in the log with
        ``why``: its connections are cut, not handed back."""
        for worker in self.workers:
            self._kill_one(worker, why)

    def _kill_one(self, worker: Worker, why: str) -> None:
        process = worker.process
        if process is None or process.returncode is not None:
            return
        if process.pid not in self._killed:
            self._killed.add(process.pid)
            log.error("worker %d (pid %d) killed: %s", worker.index, process.pid, why)
        process.kill()

    async def _keep_running(self, worker: Worker) -> None:
        backoff = 0.5
        while not self.draining:
            started = trio.current_time()
            try:
                code = await self._run_worker(worker)
            except _NotStarted as exc:
                # No process now (fork or its pipes refused: a pids limit,
                # no memory, no descriptors left): not a reason to end the
                # proxy and the workers that serve. Tried again, pausing
                # as for a worker that keeps dying.
                if self.draining:
                    return
                what = f"worker {worker.index} could not be started: {exc.cause}"
                if self._failed_start(worker, what):
                    return
                log.error("%s; trying again in %gs", what, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            for table in (LIMITS_FILE, HTTP_LIMITS_FILE):  # its connections are gone
                clear_row(self._state / table, worker.index)
            if self.draining:
                return
            ran = trio.current_time() - started
            worker.restarts += 1
            self.restarts.inc()
            pause = 0.0 if ran >= STABLE_AFTER else backoff
            backoff = 0.5 if ran >= STABLE_AFTER else min(backoff * 2, MAX_BACKOFF)
            what = f"worker {worker.index} exited ({_exit_text(code)}) after {ran:.1f}s"
            if self._failed_start(worker, what):
                return
            log.error("%s; restarting%s", what, f" in {pause:g}s" if pause else "")
            await trio.sleep(pause)

    def _failed_start(self, worker: Worker, what: str) -> bool:
        """``worker`` ended, or could not be started (``what``): whether the
        supervisor gives up, as no worker has ever said it is ready and each
        failed ``START_TRIES`` times (then it stops: ``gave_up`` says why)."""
        if self._ever_ready:
            return False
        worker.failed_starts += 1
        if any(w.failed_starts < START_TRIES for w in self.workers):
            return False
        self.gave_up = f"no worker could start ({START_TRIES} tries each; the last: {what})"
        log.error("%s: stopping", self.gave_up)
        self.draining = True
        self._kill("no worker could start")
        self._stopped.set()
        self._given_up.set()
        return True

    def _worker_config(self, config: ProxyConfig) -> ProxyConfig:
        """What a worker runs of ``config``. A private admin port (loopback,
        any free port) only behind the supervisor's own: nothing else asks a
        worker anything. Without one, the worker starts with the rules; with
        one, it is given them (ids as the supervisor numbered them) once it
        is ready."""
        if config.admin is not None:
            return config.replace(admin=Address("127.0.0.1", 0), admin_token=self.token,
                                  faults=())  # fmt: skip
        return config

    def _pinned(
        self, config: ProxyConfig, number: int, contents: dict[str, bytes], index: int
    ) -> tuple[ProxyConfig, dict[str, tuple[Path, Path]]]:
        """``config`` for a worker (re)started now: each key or CA file that
        no longer holds what it held when ``config`` was put in force (a
        refused reload's half-written Secret, say) is given to it as it was
        then, from a private copy in the state folder: a worker starts with
        the configuration in force, not one no reload put in force. Also
        the files so given: by setting, the file and its copy."""
        pinned: dict[str, tuple[Path, Path]] = {}
        for name, path in files(config).items():
            kept = contents.get(name)
            if path is None or kept is None:
                continue
            try:
                same = path.read_bytes() == kept
            except OSError:
                same = False
            if same:
                continue
            copy = self._state / "in-force" / f"{number}.{name}"
            try:
                if not copy.exists():
                    copy.parent.mkdir(mode=0o700, exist_ok=True)
                    part = copy.with_suffix(".part")
                    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    with os.fdopen(fd, "wb") as out:
                        out.write(kept)
                    part.replace(copy)
            except OSError as exc:  # (a full disk): it reads the file as it is
                log.warning("worker %d: cannot keep %s as in force (%s): %s", index, path,
                            copy, exc.strerror or exc)  # fmt: skip
                continue
            log.info("worker %d: %s changed since the configuration in force was, started "
                     "with what it held then", index, path)  # fmt: skip
            config = _with_path(config, name, copy)
            pinned[name] = (path, copy)
        return config, pinned

    async def _run_worker(self, worker: Worker) -> int:
        fds = [sock.fileno() for _, sock in self._sockets]
        # The process is made in a thread: the drain closes the listeners
        # only once it is made (they are its to inherit), then stops it.
        self._spawning += 1
        try:
            process = await trio.lowlevel.open_process(
                hangup.WORKER_COMMAND,  # (SIGHUP ignored from its first line)
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=fds,
            )
        except OSError as exc:
            raise _NotStarted(exc) from exc
        finally:
            self._spawning -= 1
        worker.process, worker.admin, worker.problem = process, None, None
        worker.said_ready, worker.silent_since, worker.misses = False, None, 0
        worker.piped, worker.pong = False, trio.Event()
        # The configuration in force as the process is known (no checkpoint
        # between): a reload decided before this starts with what it
        # decided; one decided after sees a new process, and is aborted.
        config, number, contents = self._in_force
        config, pinned = self._pinned(config, number, contents, worker.index)
        spec = WorkerSpec(self._worker_config(config), worker.index, self.count, self._state,
                          [kind for kind, _ in self._sockets], fds, self.log_level,
                          self.log_format, number, pinned)  # fmt: skip
        try:
            assert process.stdin is not None and process.stdout is not None
            if self.draining:  # SIGTERM came while it was being made: it serves nothing
                process.kill()
                return await process.wait()
            data = pickle.dumps(spec)
            # stdin then stays open, unwritten, for the worker's life: its
            # end-of-file tells the worker that this process is gone.
            try:
                async with worker.writing:
                    await process.stdin.send_all(_SPEC_LENGTH.pack(len(data)) + data)
            except trio.BrokenResourceError:  # it died before it read it all: restarted
                return await process.wait()
            with trio.move_on_after(START_TIMEOUT) as starting:
                line = await _read_line(process.stdout)
                words = line.split()
                if words[:1] == ["ready"]:
                    # It takes SIGHUP now: a reload sent none while it started.
                    worker.said_ready = True
                    self._ever_ready = True
                    if self._hup_pending:
                        with contextlib.suppress(ProcessLookupError):
                            process.send_signal(signal.SIGHUP)
                    if len(words) > 1:
                        admin = Address("127.0.0.1", int(words[1]))
                        await self._give_rules(admin)
                        worker.admin = admin
                    log.info("worker %d (pid %d) ready", worker.index, process.pid)
            if starting.cancelled_caught:
                log.error("worker %d did not start within %gs", worker.index, START_TIMEOUT)
                process.kill()
            elif worker.said_ready and worker.admin is None:
                # No admin port: its checks go over its pipes, the answers
                # read from its stdout for as long as it runs.
                async with trio.open_nursery() as reading:
                    reading.start_soon(_read_pongs, worker, process.stdout)
                    worker.piped = True
                    code = await process.wait()
                    reading.cancel_scope.cancel()
                return code
            return await process.wait()
        finally:
            worker.admin, worker.problem, worker.said_ready = None, None, False
            worker.piped = False
            worker.silent_since, worker.misses, worker.asking = None, 0, None
            with trio.CancelScope(shield=True):
                if process.returncode is None and self._stop_by is not None:
                    with trio.move_on_at(self._stop_by):  # told to stop at once
                        await process.wait()
                    if process.returncode is None:
                        self._kill_one(worker, f"did not stop within {STOP_GRACE:g}s of the "
                                       "second signal")  # fmt: skip
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                if process.stdin is not None:
                    await process.stdin.aclose()

    async def _give_rules(self, admin: Address) -> None:
        for rule in self.rules:
            try:
                status, body = await http(admin, "POST", "/faults", self.token, rule)
            except (OSError, trio.TooSlowError) as exc:  # it died while starting: restarted
                log.error("worker at %s not given fault rule %s: %s", admin, rule.get("id"), exc)
                return
            if status != 201:
                log.error("worker at %s refused fault rule %s: %s", admin, rule.get("id"), body)

    # --- the admin endpoint ---------------------------------------------------

    def readiness(self, exclude: frozenset[str] = frozenset()) -> list[str]:
        """Why the proxy is not ready (empty: ready), for /readyz.

        At start, ready once every worker is (each listening, and its first
        probe of the broker answered). From then on, ready while at least
        one worker is running and reports ready: the workers share the
        listening sockets, so one serves every client, and a worker being
        restarted, or one probe that failed on one worker, must not take a
        sidecar's pod out of its Service. Not ready while draining.
        ``exclude`` naming ``upstream``: the same without the broker (a
        worker that has said it is ready listens on the shared sockets)."""
        if self.draining:
            return ["draining"]
        if "upstream" in exclude:
            if not self.started:
                return [f"worker {w.index} starting" for w in self.workers if not w.ready]
            return [] if any(w.ready for w in self.workers) else ["no worker running"]
        looked = [w for w in self.workers if w.ready and w.problem is not None]
        failing = [f"worker {w.index}: {w.problem}" for w in looked if w.problem]
        if not self.started:
            waiting = [f"worker {w.index} starting" for w in self.workers
                       if not w.ready or w.problem is None]  # fmt: skip
            return waiting + failing
        if any(w.problem == "" for w in looked):
            return []
        return failing or ["no worker running"]

    async def _watch_readiness(self) -> None:
        # The checks themselves, each waiting for its answer up to
        # HUNG_AFTER: one that comes late (a worker busy under a heavy
        # load) says the worker is alive, if not ready in time.
        async with trio.open_nursery() as asking:
            while True:
                # Every worker at once, each for at most SCRAPE_TIMEOUT: one
                # that is stuck neither holds the others' answers back nor
                # stays ready on the answer it gave before.
                async with trio.open_nursery() as nursery:
                    for worker in self.workers:
                        if (checked := worker.checked) is not None:
                            nursery.start_soon(self._look, worker, checked, asking)
                if not self.started and all(
                    w.running and w.checked is not None and w.problem == "" for w in self.workers
                ):
                    self.started = True
                    log.info("all %d workers ready", self.count)
                self._kill_hung()
                await trio.sleep(
                    READINESS_INTERVAL if self.started else STARTING_READINESS_INTERVAL
                )

    async def _look(
        self, worker: Worker, admin: Address | trio.Process, asking: trio.Nursery
    ) -> None:
        """Ask ``worker`` (at ``admin``, or its process over its pipes:
        ``Worker.checked``) whether it is ready: its answer within
        SCRAPE_TIMEOUT, else not ready (a check still waiting for its answer
        from an earlier look is not asked again)."""
        asked = trio.current_time()
        answer: list[tuple[int, bytes] | Exception] = []
        if worker.asking != admin:
            worker.asking = admin
            over = trio.Event()
            asking.start_soon(self._check, worker, admin, answer, over)
            with trio.move_on_after(SCRAPE_TIMEOUT):
                await over.wait()
        problem = f"did not answer its readiness check within {SCRAPE_TIMEOUT:g}s"
        answered = False
        if answer:
            got = answer[0]
            if isinstance(got, Exception):
                problem = f"its readiness check failed: {got}"
            else:
                answered = True  # (not ready, its broker down, say, is an answer)
                problem = "" if got[0] == 200 else got[1].decode().strip()
        if worker.checked == admin:  # still the process asked (a dead one's is reset)
            worker.problem = problem
            if answered:
                worker.silent_since, worker.misses = None, 0
            else:
                worker.misses += 1
                if worker.silent_since is None:
                    worker.silent_since = asked

    async def _check(
        self,
        worker: Worker,
        admin: Address | trio.Process,
        answer: list[tuple[int, bytes] | Exception],
        over: trio.Event,
    ) -> None:
        """One readiness check of ``worker`` (at ``admin``, or its process
        over its pipes), its answer waited for up to HUNG_AFTER: put in
        ``answer``, then ``over`` set. One that comes after its look gave
        up waiting still says the worker is alive (not hung: ``_kill_hung``)."""
        try:
            try:
                if isinstance(admin, Address):
                    got = await http(admin, "GET", "/readyz", timeout=HUNG_AFTER)
                else:
                    got = await _ping(worker, admin, HUNG_AFTER)
            except (OSError, trio.TooSlowError) as exc:
                answer.append(exc)
            else:
                answer.append(got)
                if worker.checked == admin:  # (late too: alive, if busy)
                    worker.silent_since, worker.misses = None, 0
        finally:
            if worker.asking == admin:
                worker.asking = None
            over.set()

    def _kill_hung(self) -> None:
        """Kill every worker that has answered no readiness check for
        ``HUNG_AFTER`` (``_keep_running`` restarts it): hung, it serves
        nobody, and would hold its clients and take new ones for good."""
        now = trio.current_time()
        for worker in self.workers:
            since = worker.silent_since
            if since is None or now - since < HUNG_AFTER or self.draining:
                continue
            if worker.misses < HUNG_MISSES:  # (a check across a pause of the machine)
                continue
            self._kill_one(worker, f"answered no readiness check for {now - since:.0f}s "
                           f"({worker.problem}): hung, restarting it")  # fmt: skip

    # --- configuration reload ------------------------------------------------------

    async def _reload_json(self) -> dict[str, Any]:
        return (await self.reload_from_source("admin")).to_json()

    async def reload_from_source(self, source: str) -> Outcome:
        """Read the settings again and have every worker put them in force
        as one generation, or none: the supervisor checks what it can (what
        ``config_from`` checks), writes the configuration to the workers'
        state and signals each (SIGHUP); each checks and makes ready the rest
        (a key file read, an issuer's keys fetched) and reports. Only when
        none refused is it put in force, by every worker; when one refused,
        by none, and the answer names the workers that refused. A worker
        started later starts with the configuration in force."""
        async with self._reloading:
            if self.load is None:
                return self._reload_refused(source, ["no reloadable settings"])
            new, errors = await read_again(self.load)
            if errors:
                return self._reload_refused(source, errors)
            contents, digests = await trio.to_thread.run_sync(_read_files, new)
            live, kept = split(self.config, new, self._held, digests)
            kept_flags = flags(kept)
            if not live:
                self._reloads.labels(self.config.protocol, "unchanged").inc()
                self._refused.set(0)
                outcome = Outcome.unchanged(self.generation, source, kept_flags)
                log.info("%s", outcome.summary())
                return outcome
            try:
                config = effective(self.config, new, kept)
            except ConfigError as exc:  # a change that a kept setting refuses
                return self._reload_refused(source, str(exc).splitlines())
            # After the one committed last, published or not: a reload cut
            # short once committed (the admin endpoint's time limit) was
            # put in force by the workers, and they leave one numbered as
            # it alone (they run it already).
            number = self._in_force[1] + 1
            attempt = next(self._attempts)
            path = self._state / RELOAD_FILE
            part = path.with_suffix(".part")
            try:
                part.write_bytes(
                    pickle.dumps((attempt, number, source, self._worker_config(config)))
                )
                part.replace(path)
            except OSError as exc:  # (a full disk): no worker was asked, none changes
                return self._reload_refused(
                    source, [f"cannot hand it to the workers ({path}): {exc.strerror or exc}"]
                )
            decided = False
            try:
                asked = {w.index: w.process for w in self.workers}
                running = [w for w in self.workers if w.running]
                # A worker still starting would be ended by SIGHUP (its
                # default action, until the worker takes it): it is sent
                # one once it says it is ready (_run_worker).
                self._hup_pending = True
                for worker in running:
                    assert worker.process is not None
                    if worker.said_ready:
                        with contextlib.suppress(ProcessLookupError):
                            worker.process.send_signal(signal.SIGHUP)
                wait = ready_timeout(self.config)
                try:
                    reports = await self._reports(attempt, running, "ready", wait)
                finally:
                    self._hup_pending = False
                # All or none: a worker that refused, or said nothing in time
                # (it may yet refuse), or one started or gone meanwhile (it
                # runs the configuration in force), stops it for every one.
                errors = [f"worker {r['index']}: {e}" for r in reports
                          if r["outcome"] == "refused" for e in r["errors"]]  # fmt: skip
                told = {r["index"] for r in reports}
                for worker in self.workers:
                    if worker.process is not asked[worker.index] or (
                        worker in running and not worker.running
                    ):
                        errors.append(f"worker {worker.index}: restarted while it was being "
                                      "made ready")  # fmt: skip
                    elif worker in running and worker.index not in told:
                        errors.append(f"worker {worker.index}: did not report it made ready "
                                      f"within {wait:g}s")  # fmt: skip
                if errors:
                    unwritten = self._decide(attempt, ABORT)
                    decided = True
                    if unwritten:  # (each drops it all the same, for want of a word)
                        errors.append(unwritten)
                    return self._reload_refused(source, errors)
                unwritten = self._decide(attempt, COMMIT)
                decided = True
                if unwritten:  # no worker is told: each drops it, for want of a word
                    return self._reload_refused(source, [unwritten])
                # From here, a worker (re)started starts with it, and the
                # next reload is weighed against it.
                self._in_force = (config, number, contents)
                self.config, self._held = config, digests
            finally:
                if not decided and (unwritten := self._decide(attempt, ABORT)):
                    # Cancelled: no worker is to wait for a decision in vain.
                    log.error("configuration reload: %s", unwritten)
            done = await self._reports(attempt, running, "done", DONE_TIMEOUT)
            if config.admin is not None and self._ruled.faults != config.faults:
                # Workers behind an admin port are given their rules (their
                # configuration carries none): before the generation says
                # they run it, or a client may meet a worker without them.
                # (Against the configuration whose rules they were given
                # last: a reload cut short may not have given its own.)
                await self._replace_config_rules(self._ruled, config)
                self._ruled = config
            self.generation = Generation(number, time.time(), source)
            self._generation.set(number)
            self._loaded.set(self.generation.loaded_at)
            self._reloads.labels(self.config.protocol, "applied").inc()
            self._refused.set(0)
            outcome = Outcome("applied", self.generation, flags(live), kept_flags)
            outcome.errors += [
                f"worker {r['index']}: could not put it in force: {e}; restarted, and "
                "started with it" for r in done if r["outcome"] == "refused"
                for e in r["errors"]
            ]  # fmt: skip
            late = [w for w in running if w.index not in {r["index"] for r in done}]
            for worker in late:  # it made it ready, but is not running it: stuck
                outcome.errors.append(
                    f"worker {worker.index}: did not report it in force within "
                    f"{DONE_TIMEOUT:g}s; restarted, to start with it"
                )
                process = worker.process
                if process is asked[worker.index] and process is not None and worker.running:
                    process.send_signal(signal.SIGTERM)
            log.warning("%s (all %d workers)", outcome.summary(), self.count)
            return outcome

    async def _reports(
        self, attempt: int, workers: list[Worker], step: str, timeout: float
    ) -> list[dict[str, Any]]:
        """The reports of ``workers`` on step ``step`` (``ready``, ``done``)
        of reload ``attempt``, as they come within ``timeout``."""
        reports: dict[int, dict[str, Any]] = {}
        with trio.move_on_after(timeout):
            while len(reports) < len(workers):
                for worker in workers:
                    if worker.index in reports:
                        continue
                    report = _report(self._state, worker.index)
                    if (report is not None and report.get("attempt") == attempt
                            and report.get("step") == step):  # fmt: skip
                        reports[worker.index] = report | {"index": worker.index}
                await trio.sleep(0.05)
        return list(reports.values())

    def _decide(self, attempt: int, decision: str) -> str:
        """Reload ``attempt`` put in force by every worker, or by none: ""
        once the workers are told, else one line saying why they cannot be
        (a full disk). Then none is, and each drops the reload when no word
        comes (``decision_timeout``), keeping the configuration in force:
        the supervisor and its workers serve on."""
        path = self._state / RELOAD_DECISIONS
        line = f"{attempt} {decision}\n".encode()
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                # A line an earlier write left without its end (a full disk
                # mid-line, a crash) is ended first: this one, joined to it,
                # would be read as one line of three words, no decision.
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line
                if os.write(fd, line) != len(line):  # (torn: ended by the next)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            finally:
                os.close(fd)
        except OSError as exc:
            return (f"cannot tell the workers the decision ({decision}) in {path}: "
                    f"{exc.strerror or exc}; each keeps the configuration in force")  # fmt: skip
        return ""

    async def _replace_config_rules(self, old: ProxyConfig, new: ProxyConfig) -> None:
        """The fault rules that came with the configuration replaced by the
        new one's (rules added on /faults stay), on every worker: a rule
        the new file holds unchanged stays as it is, its counts (``times``
        spent) and holds with it."""
        before = [r.definition() for r in old.faults]
        after = [r.definition() for r in new.faults]
        # The first rule that fires acts, so the file's order counts, and a
        # worker's rules cannot be reordered: the rules in force as the new
        # file begins stay; from the first that differs on, they go and the
        # new file's rest is given in its order.
        in_force = [r for r in self.rules if r in before]
        same = 0
        while same < min(len(in_force), len(after)) and in_force[same] == after[same]:
            same += 1
        for rule in in_force[same:]:
            self.rules.remove(rule)
            await self._to_workers("DELETE", rule_path(rule["id"]))
            self._rule_totals.forget(("id", rule["id"]))
        for rule in after[same:]:
            if not any(r["id"] == rule["id"] for r in self.rules):
                self.rules.append(rule)
                await self._to_workers("POST", "/faults", rule)

    def watched(self) -> list[Path]:
        """The key and certificate files of the configuration in force:
        the supervisor watches them for every worker."""
        return watched(self.config)

    def _reload_refused(self, source: str, errors: list[str]) -> Outcome:
        self._reloads.labels(self.config.protocol, "refused").inc()
        self._refused.set(time.time())
        outcome = Outcome.refused(self.generation, source, errors)
        log.error("%s", outcome.summary())
        return outcome

    async def metrics(self) -> bytes:
        """The workers' metrics summed, plus the supervisor's own. Every
        worker is asked at once, each for at most SCRAPE_TIMEOUT: one that
        is stuck is left out rather than holding the whole answer past the
        admin endpoint's time (which answered nothing at all)."""
        number = next(self._scrapes)
        asked = await self._ask("/metrics")
        answers = {i: (pid, body.decode()) for i, (pid, body) in asked.items()}
        used, carried = self._totals.scraped(
            {i: (pid, _counters(text)) for i, (pid, text) in answers.items()}, number
        )
        merged = CollectorRegistry()
        merged.register(_Merged([answers[i][1] for i in sorted(used)], carried))
        return generate_latest(merged) + generate_latest(self.registry)

    async def _ask(self, path: str) -> dict[int, tuple[int, bytes]]:
        """GET ``path`` of every worker at once, each for at most
        SCRAPE_TIMEOUT: worker index -> (its pid, the body), of those that
        answered 200 in time."""
        answers: dict[int, tuple[int, bytes]] = {}

        async def ask(worker: Worker, admin: Address, pid: int) -> None:
            with trio.move_on_after(SCRAPE_TIMEOUT):
                try:
                    status, body = await http(admin, "GET", path)
                except (OSError, trio.TooSlowError):
                    return
                if status == 200:
                    answers[worker.index] = (pid, body)

        async with trio.open_nursery() as nursery:
            for worker in self.workers:
                if worker.admin is not None and worker.process is not None:
                    nursery.start_soon(ask, worker, worker.admin, worker.process.pid)
        return answers

    async def faults(self, request: AdminRequest) -> tuple[int, Any]:
        """/faults for every worker at once; the supervisor keeps the rule set."""
        method = request.method
        rule_id = fault_id(request.target)
        if method == "GET":
            return 200, await self._merged_rules(rule_id)
        if method not in ("POST", "DELETE") or (method == "POST" and rule_id is not None):
            raise Refused(405, "GET, POST /faults or DELETE /faults[/ID]",
                          [("Allow", "GET, POST, DELETE")])  # fmt: skip
        authorize(request, self.config.admin_token, "changing fault rules")
        if method == "DELETE":
            before = len(self.rules)
            self.rules = [r for r in self.rules if rule_id is not None and r["id"] != rule_id]
            if rule_id is not None and len(self.rules) == before:
                raise Refused(404, f"no fault rule {rule_id!r}")
            await self._to_workers(
                "DELETE", request.target if rule_id is None else rule_path(rule_id)
            )
            # A rule added again under its id starts at 0.
            self._rule_totals.forget(None if rule_id is None else ("id", rule_id))
            log.warning(
                "fault injection: %s removed", f"rule {rule_id}" if rule_id else "all rules"
            )
            return 200, {"deleted": before - len(self.rules)}
        data = json_body(request.body)
        try:
            check_room(len(self.rules))
            rule = parse_rule(data, registry.all_faults())
        except FaultError as exc:
            raise Refused(400, str(exc)) from None
        if not rule.id:
            self._rule_ids += 1
            rule.id = f"f{self._rule_ids}"
            while any(r["id"] == rule.id for r in self.rules):
                self._rule_ids += 1
                rule.id = f"f{self._rule_ids}"
        if any(r["id"] == rule.id for r in self.rules):
            raise Refused(400, f"a rule with id {rule.id!r} exists already")
        given = {k: v for k, v in rule.to_json().items() if k not in ("hits", "seen")}
        self.rules.append(given)
        await self._to_workers("POST", "/faults", given)
        log.warning("fault injection: rule %s (all %d workers)", rule.describe(), self.count)
        return 201, {"id": rule.id, "rule": rule.to_json()}

    async def snapshot(self, request: AdminRequest) -> tuple[int, Any]:
        """``POST /recording/snapshot`` for every worker at once, into one
        capture directory (readers take its files as one recording)."""
        if request.target != "/recording/snapshot":
            raise Refused(404, "try POST /recording/snapshot")
        if request.method != "POST":
            raise Refused(405, "POST /recording/snapshot", [("Allow", "POST")])
        authorize(request, self.config.admin_token, "taking a snapshot")
        wanted = SnapshotRequest.parse(request.body)
        if self._snapshotting:
            raise Refused(409, "a snapshot is being written; try again when it is done")
        self._snapshotting = True
        try:
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            name = wanted.name or snapshot_name(stamp, wanted.reason)
            body = {**wanted.to_json(), "name": name}
            answers: list[tuple[int, Any]] = []

            async def ask(worker: Worker, admin: Address) -> None:
                try:
                    status, text = await http(admin, "POST", "/recording/snapshot",
                                              self.token, body, timeout=SNAPSHOT_TIME)  # fmt: skip
                except (OSError, trio.TooSlowError) as exc:
                    answers.append((502, f"worker {worker.index}: {exc}"))
                    return
                answers.append((status, json.loads(text) if status == 201 else text.decode()))

            async with trio.open_nursery() as nursery:  # all at once: one moment
                for worker in self.workers:
                    if worker.admin is not None:
                        nursery.start_soon(ask, worker, worker.admin)
        finally:
            self._snapshotting = False
        taken = [answer for status, answer in answers if status == 201]
        if not taken:
            status, why = answers[0] if answers else (503, "no worker is running")
            raise Refused(status if status in (409, 500, 503) else 502, str(why).strip())
        return 201, {
            "path": taken[0]["path"],
            "files": [t["file"] for t in taken],
            "records": sum(t["records"] for t in taken),
            "bytes": sum(t["bytes"] for t in taken),
            "workers": len(taken),
            "failed": [str(a).strip() for s, a in answers if s != 201],
        }

    async def live(self, request: AdminRequest) -> tuple[int, Any]:
        """``POST /live`` over every worker: each asked after its own cursor
        at once, the answers' records together (connection ids are unique
        across workers), the cursor ``INDEX:N,…``."""
        if request.target != "/live":
            raise Refused(404, "try POST /live")
        if request.method != "POST":
            raise Refused(405, "POST /live", [("Allow", "POST")])
        authorize(request, self.config.admin_token, "watching traffic live")
        after = parse_after(request.body)
        answers: dict[int, dict[str, Any]] = {}

        async def ask(worker: Worker, admin: Address) -> None:
            try:
                cursor = after.get(worker.index)
                wanted = {"after": "" if cursor is None else str(cursor)}
                status, text = await http(admin, "POST", "/live", self.token, wanted)
            except (OSError, trio.TooSlowError) as exc:
                log.debug("worker %d: /live: %s", worker.index, exc)
                return
            if status == 200:
                answers[worker.index] = json.loads(text)

        async with trio.open_nursery() as nursery:
            for worker in self.workers:
                if worker.admin is not None:
                    nursery.start_soon(ask, worker, worker.admin)
        if not answers:
            raise Refused(503, "no worker answered")
        cursors = {**after, **{i: int(a["next"]) for i, a in answers.items()}}
        records = b"".join(base64.b64decode(a["records"]) for a in answers.values())
        return 200, {
            "next": ",".join(f"{i}:{n}" for i, n in sorted(cursors.items())),
            "dropped": sum(int(a["dropped"]) for a in answers.values()),
            "records": base64.b64encode(records).decode(),
        }

    async def _to_workers(self, method: str, path: str, body: object = None) -> None:
        """Tell every running worker; one that is gone gets the rule set
        when it is restarted (``_give_rules``)."""
        for worker in self.workers:
            if worker.admin is not None:
                with trio.move_on_after(5):
                    try:
                        await http(worker.admin, method, path, self.token, body)
                    except OSError as exc:
                        log.warning("worker %d: %s %s failed: %s", worker.index, method, path, exc)

    async def _merged_rules(self, rule_id: str | None) -> Any:
        """The rule set, each rule's hits and seen summed over the workers
        (asked at once; one that does not answer, or was replaced, counts
        with what it said last, as for /metrics)."""
        answers: dict[int, tuple[int, _Counts]] = {}
        number = next(self._scrapes)
        for index, (pid, body) in (await self._ask("/faults")).items():
            samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for rule in json.loads(body)["rules"]:
                samples[("hits", (("id", rule["id"]),))] = float(rule["hits"])
                samples[("seen", (("id", rule["id"]),))] = float(rule["seen"])
            answers[index] = (pid, {"faults": ("", "counter", samples)})
        used, counts = self._rule_totals.scraped(answers, number)
        for index in used:
            _add(counts, answers[index][1])
        summed = counts.get("faults", ("", "", {}))[2]
        out = []
        for rule in self.rules:
            key = (("id", rule["id"]),)
            hits, seen = summed.get(("hits", key), 0.0), summed.get(("seen", key), 0.0)
            out.append({**rule, "hits": int(hits), "seen": int(seen)})
        if rule_id is None:
            return {"rules": out}
        for rule in out:
            if rule["id"] == rule_id:
                return rule
        raise Refused(404, f"no fault rule {rule_id!r}")


# Counter samples of some workers: family -> (help, type, sample -> value).
_Counts = dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]]
_MONOTONIC = {"counter", "histogram", "summary"}


def _counters(text: str) -> _Counts:
    """The samples of a worker's /metrics that only ever grow."""
    out: _Counts = {}
    for family in text_string_to_metric_families(text):
        if family.type not in _MONOTONIC or family.name in _SUPERVISORS:
            continue
        values = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                  for sample in family.samples if not sample.name.endswith("_created")}  # fmt: skip
        out[family.name] = (family.documentation, family.type, values)
    return out


def _add(into: _Counts, counts: _Counts) -> None:
    for name, (documentation, kind, values) in counts.items():
        mine = into.setdefault(name, (documentation, kind, {}))[2]
        for key, value in values.items():
            mine[key] = mine.get(key, 0.0) + value


class _Totals:
    """What keeps the workers' summed counters from going down, which
    Prometheus takes for a reset: a worker that did not answer a scrape
    counts with what it said last, and one that was replaced (restarted)
    leaves what it said last behind for good. (What a worker counted after
    its last scrape and before it died is not known.)"""

    def __init__(self) -> None:
        self._last: dict[int, tuple[int, _Counts]] = {}  # worker index -> (pid, counts)
        self._taken: dict[int, int] = {}  # worker index -> the scrape _last is from
        self._gone: _Counts = {}  # of processes that were replaced

    def forget(self, label: tuple[str, str] | None) -> None:
        """Leave out, from now on, the samples with ``label`` (None: all):
        what they counted is gone with them (a fault rule removed)."""
        for counts in (self._gone, *(c for _, c in self._last.values())):
            for _, _, values in counts.values():
                for key in [k for k in values if label is None or label in k[1]]:
                    del values[key]

    def scraped(
        self, answers: dict[int, tuple[int, _Counts]], number: int
    ) -> tuple[set[int], _Counts]:
        """From the answers of scrape ``number`` (worker index -> (pid, its
        counts)): the workers whose answers to sum, and the counts to add to
        them. Scrapes are numbered as they are asked for; an answer older
        than one taken already (two scrapes at once, the earlier ending
        last) is left out, its worker counting with the newer one."""
        used: set[int] = set()
        for index, (pid, counts) in answers.items():
            if self._taken.get(index, -1) > number:
                continue
            last = self._last.get(index)
            if last is not None and last[0] != pid:
                _add(self._gone, last[1])
            self._last[index], self._taken[index] = (pid, counts), number
            used.add(index)
        carried: _Counts = {}
        _add(carried, self._gone)
        for index, (_, counts) in self._last.items():
            if index not in used:
                _add(carried, counts)
        return used, carried


class _Merged(Collector):
    """Prometheus text from several workers as one set of metrics: counters,
    histograms and most gauges summed; ``*_up`` the worst, build info once.
    ``carried``: counts of workers that did not answer or are gone, added."""

    def __init__(self, texts: list[str], carried: _Counts | None = None) -> None:
        self.texts = texts
        self.carried = carried or {}

    def collect(self) -> Any:
        families: dict[str, Metric] = {}
        values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for text in self.texts:
            for family in text_string_to_metric_families(text):
                if family.name.endswith("_created") or family.name in _SUPERVISORS:
                    continue  # per-process creation times: not meaningful summed
                families.setdefault(family.name, family)
                merged = values.setdefault(family.name, {})
                for sample in family.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    if key not in merged:
                        merged[key] = sample.value
                    elif family.name in _GAUGE_MIN:
                        merged[key] = min(merged[key], sample.value)
                    elif family.name in _GAUGE_MAX:
                        merged[key] = max(merged[key], sample.value)
                    else:
                        merged[key] += sample.value
        for name, (documentation, kind, carried) in self.carried.items():
            families.setdefault(name, Metric(name, documentation, kind))
            merged = values.setdefault(name, {})
            for key, value in carried.items():
                merged[key] = merged.get(key, 0.0) + value
        for name, family in families.items():
            out = Metric(name, family.documentation, family.type)
            for (sample_name, labels), value in values[name].items():
                out.add_sample(sample_name, dict(labels), value)
            yield out


async def http(
    address: Address,
    method: str,
    path: str,
    token: str | None = None,
    body: object = None,
    *,
    timeout: float = 10.0,
) -> tuple[int, bytes]:
    """One HTTP/1.1 call to a worker's private admin endpoint, answered
    within ``timeout`` (trio.TooSlowError otherwise)."""
    data = b"" if body is None else json.dumps(body).encode()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (f"{method} {path} HTTP/1.1\r\nHost: {address}\r\n{auth}"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")  # fmt: skip
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(address.host, address.port)
        try:
            await stream.send_all(head.encode() + data)
            answer = b""
            while chunk := await stream.receive_some(65536):
                answer += chunk
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            # A worker killed mid-call resets the connection. trio's error is
            # not an OSError; callers handle OSError for "that worker is gone".
            raise OSError(f"worker admin at {address}: {exc}") from exc
        finally:
            await stream.aclose()
    status_line, _, rest = answer.partition(b"\r\n")
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise OSError(f"bad answer from worker admin at {address}")
    return int(parts[1]), rest.split(b"\r\n\r\n", 1)[-1]


async def _tell_drain(worker: Worker, process: trio.Process) -> None:
    """Tell ``worker`` (``process``) to drain, as SIGTERM would: a word on
    its stdin, after its settings."""
    async with worker.writing:
        if process.stdin is None or process.returncode is not None:
            return
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await process.stdin.send_all(_DRAIN)


def _tell_stop(worker: Worker) -> bool:
    """Tell ``worker`` to stop at once (``_STOP`` on its stdin, after its
    drain word): whether it was told (not while its settings are being
    written, nor once its stdin is gone)."""
    process = worker.process
    if process is None or process.stdin is None or worker.writing.locked():
        return False
    stdin = process.stdin
    assert isinstance(stdin, trio.lowlevel.FdStream)
    try:
        return os.write(stdin.fileno(), _STOP) == 1
    except (OSError, ValueError):  # full (never: a byte or two), gone, closed
        return False


async def _ping(worker: Worker, process: trio.Process, timeout: float) -> tuple[int, bytes]:
    """A readiness check of ``worker`` without an admin port: ``_PING`` on
    its stdin, answered (``_PONG`` on its stdout, ``_read_pongs``) by its
    trio loop within ``timeout`` (trio.TooSlowError otherwise), as a 200
    from its /readyz. A worker whose loop is stuck answers none."""
    with trio.fail_after(timeout):
        answered = worker.pong = trio.Event()
        # Written at once, as _tell_stop writes: the lock on its stdin is
        # not held (a second signal finding it held kills the worker), and
        # while it is held its drain word is being written (no kills then).
        stdin = process.stdin
        if stdin is None or process.returncode is not None or worker.writing.locked():
            raise OSError(f"worker {worker.index}: its stdin is closed or being written")
        assert isinstance(stdin, trio.lowlevel.FdStream)
        try:
            os.write(stdin.fileno(), _PING)
        except ValueError as exc:  # (closed meanwhile)
            raise OSError(f"worker {worker.index}: its stdin: {exc}") from exc
        await answered.wait()
    return 200, b""


async def _read_pongs(worker: Worker, stdout: trio.abc.ReceiveStream) -> None:
    """The worker's answers to its checks (``_ping``), read from its stdout
    until it closes."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while chunk := await stdout.receive_some(1024):
            if _PONG in chunk:
                worker.pong.set()


async def _read_line(stream: trio.abc.ReceiveStream) -> str:
    data = b""
    while b"\n" not in data:
        chunk = await stream.receive_some(1024)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace")


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


async def serve_workers(
    config: ProxyConfig,
    count: int,
    log_level: str,
    log_format: str,
    *,
    load: Callable[[], ProxyConfig] | None = None,
    config_file: Path | None = None,
) -> None:
    supervisor = Supervisor(config, count, log_level, log_format, load=load)
    await supervisor.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        for kind, address in supervisor.addresses.items():
            log.info("listening (%s) on %s with %d workers, upstream %s", kind, address, count,
                     config.broker)  # fmt: skip
        if load is not None:
            nursery.start_soon(reload_when_asked, supervisor, config_file)
        async with trio.open_nursery() as serving:  # until signalled, or given up

            async def until_given_up() -> None:
                await supervisor._given_up.wait()
                serving.cancel_scope.cancel()

            serving.start_soon(until_given_up)
            await serve_until_signalled(supervisor)
            serving.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    if supervisor.gave_up is not None:  # (exit code 1, the reason logged)
        raise ConfigError(supervisor.gave_up)
    log.info("stopped")


# --- the worker process ------------------------------------------------------------


@dataclass
class _Reloads:
    """A worker's side of a reload: on SIGHUP, the configuration the
    supervisor wrote (when it is newer than the one in force) checked and
    made ready, reported, and put in force as the supervisor's generation
    once the supervisor says every worker could (or dropped when one
    could not), reported again."""

    proxy: Proxy
    state: Path
    index: int
    # The files this worker was given as a private copy (WorkerSpec.pinned).
    pinned: dict[str, tuple[Path, Path]] = field(default_factory=dict)
    # The supervisor's decisions so far, by attempt, and where they are read.
    _decided: dict[int, str] = field(default_factory=dict)
    _decisions: Journal | None = None

    def watched(self) -> list[Path]:
        """None: the supervisor watches the files and hands reloads on."""
        return []

    async def catch_up(self) -> None:
        """Once the worker can take SIGHUP: a reload written while it started
        (its spec predates it, or the signal came too early) is taken now.
        One aborted already is none of its business: it runs the
        configuration in force, and has nothing to leave or to say."""
        try:
            attempt = pickle.loads((self.state / RELOAD_FILE).read_bytes())[0]
        except FileNotFoundError:
            return
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError):
            attempt = None  # (reload_from_source says what is wrong with it)
        if attempt is None or self._decision(attempt) != ABORT:
            await self.reload_from_source("SIGHUP")

    async def reload_from_source(self, source: str) -> Outcome:
        try:
            attempt, number, said, config = pickle.loads((self.state / RELOAD_FILE).read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
            return self.proxy.refuse_reload(source, [f"no configuration to reload: {exc}"])
        if self._decision(attempt) == ABORT:  # aborted before this worker came to it
            log.warning("configuration reload (%s): not put in force: aborted before this "
                        "worker came to it", said)  # fmt: skip
            return Outcome("unchanged", self.proxy.generation)
        if number <= self.proxy.generation.number:
            self._write(attempt, "ready", "unchanged")
            outcome = Outcome("unchanged", self.proxy.generation)
            self._write(attempt, "done", outcome.outcome)
            return outcome
        config = await trio.to_thread.run_sync(_as_pinned, config, self.proxy.config, self.pinned)
        async with self.proxy.preparing(config, said, number) as prepared:
            if isinstance(prepared, Outcome):  # refused here
                self._write(attempt, "ready", "refused", prepared.errors)
                if await self._decided_on(attempt) == COMMIT:
                    # Not to be: the supervisor commits only what every
                    # worker made ready. Should it come, this worker does not
                    # serve another configuration than the others: it says
                    # so (in the log and the reload's answer) and restarts,
                    # starting with what they run, or failing to start.
                    self._write(attempt, "done", "refused", prepared.errors)
                    log.error("generation %d was put in force by the other workers although "
                              "this one refused it (%s): restarting, to run what they run",
                              number, "; ".join(prepared.errors))  # fmt: skip
                    os.kill(os.getpid(), signal.SIGTERM)
                return prepared
            self._write(attempt, "ready", "ready")
            decision = await self._decided_on(attempt)
            if decision != COMMIT:
                why = (
                    "another worker refused it, or did not answer in time"
                    if decision == ABORT
                    else "no word from the supervisor"
                )
                return self.proxy.refuse_reload(said, [f"not put in force: {why}"])
            outcome = prepared()
        self._write(attempt, "done", outcome.outcome, outcome.errors)
        return outcome

    def _write(
        self, attempt: int, step: str, outcome: str, errors: list[str] | None = None
    ) -> None:
        report = {"attempt": attempt, "step": step, "outcome": outcome, "errors": errors or []}
        path = self.state / RELOAD_REPORT.format(index=self.index)
        part = path.with_suffix(".part")
        part.write_text(json.dumps(report))
        part.replace(path)

    def _decision(self, attempt: int) -> str | None:
        """The supervisor's decision on reload ``attempt``, if made."""
        try:
            if self._decisions is None:
                self._decisions = Journal(self.state / RELOAD_DECISIONS)
            for words in self._decisions.new_lines():
                if len(words) == 2 and words[0].isdigit():
                    self._decided[int(words[0])] = words[1]
        except OSError:  # (the supervisor could not write it): no word, as yet
            pass
        return self._decided.get(attempt)

    async def _decided_on(self, attempt: int) -> str | None:
        """The decision on reload ``attempt``, waited for (None: none came)."""
        with trio.move_on_after(decision_timeout(self.proxy.config)):
            while (decision := self._decision(attempt)) is None:
                await trio.sleep(0.02)
            return decision
        return None


def _report(state: Path, index: int) -> dict[str, Any] | None:
    try:
        report: dict[str, Any] = json.loads((state / RELOAD_REPORT.format(index=index)).read_text())
    except (OSError, ValueError):
        return None
    return report


async def _work(spec: WorkerSpec, role: WorkerRole, supervisor: int) -> bool:
    """Serve until signalled or orphaned; whether the supervisor was gone."""
    proxy = Proxy(spec.config, role)
    routing = getattr(proxy.backend, "routing", None)
    share_forgetting(proxy.ports, routing, spec.state, spec.index, spec.count)
    proxy.generation = Generation(spec.generation, time.time(), "start")
    proxy.metrics.generation(proxy.generation)
    orphaned: list[bool] = []
    told = _Told()
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        reloads = _Reloads(proxy, spec.state, spec.index, spec.pinned)
        await nursery.start(reload_when_asked, reloads, None)
        nursery.start_soon(reloads.catch_up)
        nursery.start_soon(_watch_supervisor, proxy, supervisor, orphaned, told)
        admin = proxy.addresses.get("admin")
        print("ready" if admin is None else f"ready {admin.port}", flush=True)
        await _serve(proxy, told)
        nursery.cancel_scope.cancel()
    return bool(orphaned)


def share_forgetting(
    ports: BrokerPorts | None,
    routing: Any,
    state: Path,
    index: int,
    count: int,
    clocks: tuple[float, float] | None = None,
) -> None:
    """Worker ``index`` of ``count``, before it serves: what it forgets is
    shared. A broker's port relays no more once every worker forgot the
    broker (``SharedBrokerPorts.share_forgetting``). Each broker its routing
    forgets is written in the routes journal (``ForgottenRoutes``), unless
    learned again meanwhile (a lookup between the forgetting and the
    backend's sweep that reports it), and a worker started in a dead one's
    place, whose routing reads every broker ever learned from the
    journal, forgets at once those every other worker has forgotten since
    (queued for the backend like any it forgets: their ports' forgetting
    voted for too), and takes the others as named when the supervisor's
    clock marks say they were last learned, not now (another hour in this
    worker, at every restart). ``clocks``: now, on the cores' clock and on
    ``time.monotonic``'s (None: read now)."""
    if ports is None:
        return
    if ports.journal is not None:
        ports.journal.share_forgetting(index, count, state / BROKER_PORTS_VOTES)
    forget = getattr(routing, "forget", None)
    if routing is None or forget is None:  # a backend that forgets no broker
        return
    forgotten = ForgottenRoutes(state / ROUTES_FILE, index, count)

    def forgot(broker: Address) -> None:
        if not routing.knows(broker):
            forgotten.forgot(broker)

    ports.forgetting = forgot
    routing.refresh()  # (first: what it learns from the journal, then forgotten)
    everywhere, learned = forgotten.read()
    for broker in everywhere:
        if routing.allowlist.knows(broker):
            forget(broker)
            routing.forgotten.append(broker)
            log.info("broker %s forgotten: every other worker had forgotten it before this "
                     "one started (a lookup that names it learns it again)", broker)  # fmt: skip
    if not learned:  # (a journal without the supervisor's marks)
        return
    now, monotonic = clocks if clocks is not None else (trio.current_time(), time.monotonic())
    for broker, when in learned.items():
        if broker not in everywhere and routing.allowlist.knows(broker):
            routing.allowlist.learn(broker, now - max(0.0, monotonic - when))


@dataclass
class _Told:
    """The supervisor's word to drain (or its absence: it is gone), and why."""

    why: str = ""
    event: trio.Event = field(default_factory=trio.Event)
    # The supervisor's word to stop at once (its second signal).
    now: trio.Event = field(default_factory=trio.Event)

    def set(self, why: str) -> None:
        if not self.event.is_set():
            self.why = why
            self.event.set()


async def _serve(proxy: Proxy, told: _Told) -> None:
    """Serve until SIGTERM, SIGINT or the supervisor's word (``told``), then
    drain; a second signal stops at once. The supervisor's word counts as
    no signal: a service manager or a terminal that signals every process
    of the proxy at once (systemd's stop, Ctrl-C, dumb-init) tells each
    worker twice, by its signal and by the supervisor, in either order."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        first = _Told()

        async def signalled() -> None:
            seen = 0
            async for signum in signals:
                seen += 1
                if seen > 1:
                    log.warning("second signal: stopping now")
                    proxy.stop()
                    return
                first.set(signal.Signals(signum).name)

        async def worded() -> None:
            await told.event.wait()
            first.set(told.why)

        async def stopped_now() -> None:
            await told.now.wait()
            first.set(told.why)
            log.warning("the supervisor stops at once: stopping now")
            proxy.stop()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(signalled)
            nursery.start_soon(worded)
            nursery.start_soon(stopped_now)
            await first.event.wait()
            log.info("%s: draining", first.why)
            await proxy.drain()
            nursery.cancel_scope.cancel()


async def _watch_supervisor(
    proxy: Proxy, supervisor: int, orphaned: list[bool], told: _Told
) -> None:
    """The supervisor's word to drain (``_DRAIN`` on stdin), and once the
    supervisor is gone (end-of-file on stdin, or a new parent), drain as
    SIGTERM would: the listeners close at once, freeing the port for a new
    ``sluice proxy``, and connections are handed back within
    ``--drain-timeout``."""
    while True:
        with trio.move_on_after(SUPERVISOR_CHECK):
            await trio.lowlevel.wait_readable(_LIFELINE)
            word = os.read(_LIFELINE, 1)
            if not word:
                seen = "end of file on stdin"
                break
            if word == _DRAIN:
                told.set("the supervisor drains")
            elif word == _STOP:
                told.set("the supervisor stops")
                told.now.set()
            elif word == _PING:  # a readiness check (no admin port): this loop runs
                with contextlib.suppress(OSError):  # (the supervisor gone: seen on stdin)
                    os.write(_ANSWERS, _PONG)
        if os.getppid() != supervisor:
            seen = "a new parent"
            break
    if not proxy.listening or told.event.is_set():
        return  # draining already, on the supervisor's word
    log.warning("the supervisor (pid %d) is gone (%s): draining, then exiting", supervisor, seen)
    orphaned.append(True)
    told.set("the supervisor is gone")


# The worker's stdin: the spec, then the supervisor's word to drain (and,
# on its second signal, to stop at once), then nothing until it is gone
# but, without an admin port, its readiness checks (_PING), each answered
# on the worker's stdout (_PONG) after its "ready" line.
_LIFELINE = 0
_DRAIN = b"d"
_STOP = b"s"  # after _DRAIN: the supervisor's second signal
_PING = b"\x05"  # (ASCII ENQ)
_ANSWERS = 1  # the worker's stdout
_PONG = b"\x06"  # (ASCII ACK: no text the process may print holds it)


def _read_spec() -> WorkerSpec:
    (size,) = _SPEC_LENGTH.unpack(_read_exactly(_LIFELINE, _SPEC_LENGTH.size))
    spec: WorkerSpec = pickle.loads(_read_exactly(_LIFELINE, size))
    return spec


def _read_exactly(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("the supervisor went away before the worker started")
        data += chunk
    return data


def _read_files(config: ProxyConfig) -> tuple[dict[str, bytes], dict[str, str | None]]:
    """What the files of ``config``'s settings of FILES hold now, by setting
    (those that could be read), and that as ``reload.held`` says it: a
    SHA-256 of each; None where unset, "unreadable" where it cannot be read."""
    contents: dict[str, bytes] = {}
    digests: dict[str, str | None] = {}
    for name, path in files(config, FILES).items():
        if path is None:
            digests[name] = None
            continue
        try:
            contents[name] = path.read_bytes()
        except OSError:
            digests[name] = "unreadable"
            continue
        digests[name] = hashlib.sha256(contents[name]).hexdigest()
    return contents, digests


def _as_pinned(new: Any, old: Any, pinned: dict[str, tuple[Path, Path]]) -> Any:
    """``new`` (a reload's configuration) naming the private copy ``old``
    (the worker's, in force) names where ``new`` names the file it is a copy
    of, and the file holds what the copy does: the same setting, not a
    change (which would make anew what it is for: the issuers' keys fetched
    again, a reload refused while the issuer is away)."""
    named, running = files(new), files(old)
    for name, (path, copy) in pinned.items():
        if named.get(name) != path or running.get(name) != copy:
            continue
        try:
            same = path.read_bytes() == copy.read_bytes()
        except OSError:
            same = False
        if same:
            new = _with_path(new, name, copy)
    return new


def _with_path(config: Any, name: str, path: Path) -> Any:
    """``config`` with the setting ``name`` (of FILES; ``a.b``: field ``b``
    of field ``a``) naming ``path``."""
    head, _, rest = name.partition(".")
    if not rest:
        return dataclasses.replace(config, **{head: path})
    return dataclasses.replace(config, **{head: _with_path(getattr(config, head), rest, path)})


def _config_errors(exc: BaseException) -> list[ConfigError] | None:
    """The ConfigErrors ``exc`` is (through exception groups); None when it
    holds anything else."""
    if isinstance(exc, ConfigError):
        return [exc]
    if not isinstance(exc, BaseExceptionGroup):
        return None
    found: list[ConfigError] = []
    for inner in exc.exceptions:
        errors = _config_errors(inner)
        if errors is None:
            return None
        found += errors
    return found


def main() -> int:
    supervisor = os.getppid()
    try:
        spec = _read_spec()
    except EOFError:
        return 1
    setup_logging(spec.log_level, spec.log_format, worker=spec.index)
    keep_big_buffers()
    # A reload's SIGHUP before the worker listens for it must not end it
    # (the default action): ignored until then, and caught up with after.
    # (Ignored already by hangup.WORKER_COMMAND's first line; here for a
    # worker started otherwise: python -m sluice.proxy.workers.)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sockets = [(kind, socket.socket(fileno=fd)) for kind, fd in zip(spec.kinds, spec.fds,
                                                                    strict=True)]  # fmt: skip
    role = WorkerRole(spec.index, spec.count, spec.state, sockets)
    try:
        orphaned = trio.run(_work, spec, role, supervisor)
    except KeyboardInterrupt:
        return 130
    except (ConfigError, BaseExceptionGroup) as exc:
        # A key file gone since the supervisor checked it, say: one line
        # each start (the supervisor says it exited, and restarts it).
        errors = _config_errors(exc)
        if errors is None:
            raise
        for error in errors:
            log.error("worker %d cannot start: %s", spec.index, error)
        return 1
    if orphaned:  # nobody else is left to remove the shared state
        shutil.rmtree(spec.state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _admin_refused(peer: Address, error: HeaderError) -> None:
    log.warning("admin connection from %s: rejected: PROXY header: %s", peer, error.message)
