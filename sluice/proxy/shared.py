"""State that worker processes of one proxy share: learned brokers, limits.

With ``--workers N`` a client's lookup may be answered by one worker and its
CONNECT (``proxy_to_broker_url``) land on another, and connection limits are
totals over all workers. Two small structures in files the supervisor
creates (in a private temporary directory) carry that:

- ``Journal``: an append-only file of lines, which Pulsar's
  ``SharedRouting`` (``proxy/pulsar.py``) keeps the brokers learned from
  lookup answers in. A worker appends a line when it learns a broker it
  did not know (an ``O_APPEND`` write of one short line is atomic), before
  the answer that names it reaches the client; a worker asked for a broker
  it does not know reads the journal's new lines before deciding. So a
  broker learned anywhere is known everywhere by the time a client can ask.
- ``SharedLimits``: connection counts (the binary listeners', and in a
  table of its own the HTTP listener's) in a memory-mapped table, one row per
  worker (its total, and its count per client-IP bucket). Each worker writes
  only its own row, so there are no locks; a check sums the rows. Two workers
  accepting at the same instant can each see room for one more, so a limit
  can be exceeded by at most N-1 connections; IPs that share a bucket share
  its count (4,096 buckets), which only ever makes the limit stricter.
- ``SharedBrokerPorts`` (port-per-broker): the supervisor binds every
  port of ``--listener-ports`` and every worker accepts on all of them; a
  journal says which broker each port stands for, and whether the port
  speaks TLS (a broker has a plain and a TLS port when Sluice listens both
  ways). A port is given under an exclusive lock on the journal, so no two
  workers give one port twice or one broker two ports of one kind. A
  broker every worker has forgotten (``SharedBrokerPorts.forget``: each
  says so in a journal of votes) is marked forgotten there: its port relays
  no more, until a lookup names the broker again, which gives it back.
- ``ForgottenRoutes``: which learned brokers each worker has forgotten,
  written in the routes journal itself (in order with the lines learning
  them), so that a worker started in a dead one's place, which reads the
  journal from its start, does not trust again a broker every other worker
  had forgotten. ``learned_from_ports_file``: the brokers an earlier run's
  ``--broker-ports-file`` names, written there by the supervisor at start
  as learned, so that they are forgotten as any learned broker is.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import mmap
import os
import re
import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from sluice.addresses import Address, client_host
from sluice.errors import ConfigError

log = logging.getLogger("sluice.proxy")

ROUTES_FILE = "routes"
LIMITS_FILE = "limits"
HTTP_LIMITS_FILE = "http-limits"  # the HTTP listener's, --http-max-connections
BROKER_PORTS_FILE = "broker-ports"
BROKER_PORTS_LOCK = "broker-ports.lock"  # the workers' lock while one gives a port
# Which workers have forgotten the broker of which port (this run's only).
BROKER_PORTS_VOTES = "broker-ports-forgotten"
BUCKETS = 4096
_SLOT = 8  # bytes per counter (int64)


class Journal:
    """An append-only file of short lines that several processes write and
    read: one ``O_APPEND`` write of a line is atomic."""

    def __init__(self, path: Path, fd: int | None = None) -> None:
        """``fd``: ``path`` opened already (read-write, appending)."""
        self.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600) if fd is None else fd
        self._read = 0
        self._partial = b""
        # A line a crash (or a full disk) left without its end: ended now, so
        # that the next line is not joined to it and lost with it. (Lines
        # are written whole: only a torn one ends without a newline.)
        size = os.fstat(self.fd).st_size
        if size and os.pread(self.fd, 1, size - 1) != b"\n":
            os.write(self.fd, b"\n")

    def append(self, line: str) -> None:
        os.write(self.fd, f"{line}\n".encode())

    def new_lines(self) -> Iterator[list[str]]:
        """The lines written (by anyone) since the last call, split into words."""
        while True:
            chunk = os.pread(self.fd, 65536, self._read)
            if not chunk:
                return
            self._read += len(chunk)
            lines = (self._partial + chunk).split(b"\n")
            self._partial = lines.pop()
            for line in lines:
                yield line.decode(errors="replace").split()

    def close(self) -> None:
        os.close(self.fd)


# The kinds of listener: plain TCP, TLS. A per-broker port is of one kind.
PLAIN = "plain"
TLS = "tls"
KINDS = (PLAIN, TLS)


def open_ports_file(path: Path) -> int:
    """``--broker-ports-file``, opened (created if missing) for reading and
    appending: its descriptor. ConfigError, one line naming the file, if it
    cannot be (read-only, a mounted ConfigMap, ``chattr +i``, a directory)."""
    try:
        return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ConfigError(
            f"--broker-ports-file {path}: cannot open it for reading and writing: "
            f"{exc.strerror or exc}"
        ) from None


def hold_ports_file(path: Path) -> int:
    """``--broker-ports-file``, opened and locked for the life of the proxy
    (a lone one, or a supervisor and its workers): its descriptor. Two
    proxies that shared one would each give brokers ports the other does
    not listen on, and rewrite each other's lines; the second is refused,
    in one line naming the file (ConfigError)."""
    fd = open_ports_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"--broker-ports-file {path}: another sluice proxy is using it "
            "(each proxy needs a file of its own)"
        ) from None
    except OSError as exc:  # ENOLCK: a file system without locks (some NFS mounts)
        os.close(fd)
        raise ConfigError(
            f"--broker-ports-file {path}: cannot lock it: {exc.strerror or exc} "
            "(put it on a file system that supports locks)"
        ) from None
    return fd


# What a draining supervisor writes in its workers' lock (BROKER_PORTS_LOCK).
_DRAINING = b"draining\n"


def stop_giving_ports(lock: Path) -> None:
    """A draining supervisor's: no worker gives a broker a port from now on
    (the mark is written under ``lock``, the workers' lock while one gives
    a port, so none is half way through one), and ``--broker-ports-file``
    may be let go to a proxy started in this one's place."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, _DRAINING, 0)
    finally:
        os.close(fd)  # (the lock goes with it)


def check_ports_file(path: Path) -> None:
    """Where the configuration is checked (before any worker is started):
    ``--broker-ports-file`` can be kept, or ConfigError naming it."""
    os.close(open_ports_file(path))


class SharedBrokerPorts:
    """Which of the supervisor's ``--listener-ports`` stands for which broker,
    and speaks which kind (``PLAIN``, ``TLS``), for every worker
    (port-per-broker, ``sluice/proxy/ports.py``; see the module's notes).

    A journal line is ``PORT HOST BROKER_PORT KIND``; a line without the
    kind (written before per-broker TLS listeners existed) is of
    ``main_kind``, the kind the per-broker listeners had then: the first of
    ``--listen``, ``--listen-tls``. ``PORT HOST BROKER_PORT KIND forgotten``:
    that broker, forgotten (by every worker), is relayed to on that port no
    more (``broker_for``) until a line giving it the port again; the port
    stays its own. ``span``: the ``--listener-ports``
    range; a line whose port is outside it (the range was another when it
    was written) or that does not parse (a damaged file) is ignored, with a
    warning naming the file and the line."""

    def __init__(
        self,
        journal: Path,
        main_kind: str = PLAIN,
        span: tuple[int, int] | None = None,
        *,
        held: bool = False,
        lock: Path | None = None,
        warn: bool = True,
    ) -> None:
        """``held``: the journal is this process's alone, locked for its
        life (``hold_ports_file``: a lone proxy's ``--broker-ports-file``).
        Otherwise each ``assign`` locks ``lock`` (a worker's: a file of the
        supervisor's state, which holds ``--broker-ports-file`` for life),
        or else the journal itself. ``warn``: lines ignored are warned
        about (not by a reader whose workers warn anyway)."""
        self.path = journal
        self.warn = warn
        self.held = held
        self.main_kind = main_kind
        self.span = span
        self._journal = Journal(
            journal, hold_ports_file(journal) if held else open_ports_file(journal)
        )
        self._lock: int | None = None
        if not held:
            self._lock = (
                self._journal.fd if lock is None else os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
            )
        self._lines = 0  # read so far
        self._let_go = False  # draining: the file is another proxy's to take
        self.by_port: dict[int, tuple[Address, str]] = {}
        self.by_broker: dict[tuple[Address, str], int] = {}
        # Ports whose broker was forgotten (``forget``): relayed from no more.
        self.forgotten: set[int] = set()
        # A worker's (``share_forgetting``): which one it is, of how many,
        # and which workers have forgotten the broker of each port.
        self._worker = 0
        self._workers = 0
        self._votes: Journal | None = None
        self.voted: dict[int, set[int]] = {}

    def share_forgetting(self, worker: int, workers: int, votes: Path) -> None:
        """A worker's, ``worker`` of ``workers``: a broker is marked
        forgotten once every worker has forgotten it, each saying so in
        ``votes`` (a journal of this run's, ``BROKER_PORTS_VOTES``), so
        that a worker that still sees it named keeps its port relaying."""
        self._worker, self._workers = worker, workers
        self._votes = Journal(votes)

    def let_go(self) -> None:
        """Draining: give no broker a port from now on, and let a held
        journal go (unlocked), for a proxy started in this one's place."""
        self._let_go = True
        if self._lock is None:  # held: this process's alone until now
            fcntl.flock(self._journal.fd, fcntl.LOCK_UN)
            log.info("--broker-ports-file %s let go: no broker is given a port while "
                     "draining", self.path)  # fmt: skip

    def _draining(self) -> bool:
        """Whether this proxy drains (``let_go``, or a worker's supervisor
        said so: ``stop_giving_ports``); asked under the lock."""
        if self._let_go:
            return True
        if self._lock is None or self._lock == self._journal.fd:
            return False
        return os.pread(self._lock, len(_DRAINING), 0) == _DRAINING

    def assign(self, broker: Address, ports: Iterable[int], kind: str = PLAIN) -> int | None:
        """The port of kind ``kind`` that stands for ``broker``: the one some
        worker gave it, if it is one of ``ports`` (the ports this proxy
        listens on), or else the first of ``ports`` no broker has (None:
        all are taken). ValueError: a host name the journal cannot hold
        (empty, spaces, not text), which no reply from a working broker has,
        or a proxy that drains (``let_go``, ``stop_giving_ports``)."""
        host = broker.host.lower()
        if not host or host.split() != [host] or not host.isprintable():
            raise ValueError(f"broker host {broker.host!r} cannot be given a port")
        key = (Address(host, broker.port), kind)
        ports = list(ports)
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            self.refresh()
            port = self.by_broker.get(key)
            if port is not None and port not in ports:  # bound by another program at start
                log.warning("broker %s: port %d, which %s gives it, is not one this proxy "
                            "listens on: it is given another", broker, port, self.path)  # fmt: skip
                port = None
            if port is not None and self._unforget(broker, port, kind):
                self.refresh()
            if port is None and self._draining():
                raise ValueError(f"broker {broker}: draining, so no broker is given a new port")
            if port is None:
                port = next((p for p in ports if p not in self.by_port), None)
                if port is not None:
                    self._journal.append(f"{port} {host} {broker.port} {kind}")
                    self.refresh()
                    if self.by_broker.get(key) != port:  # the journal did not take it
                        raise ValueError(f"broker {broker} could not be given port {port}")
            return port
        finally:
            if self._lock is not None:
                fcntl.flock(self._lock, fcntl.LOCK_UN)

    def _unforget(self, broker: Address, port: int, kind: str) -> bool:
        """Under the lock: ``broker``, named again, keeps ``port`` and is
        relayed to on it again (this worker's vote taken back; the port's
        forgetting undone, unless draining: the file may be another
        proxy's). A port every worker had forgotten takes back every
        worker's vote: each learns the broker again (the routes journal's
        line, ``ForgottenRoutes``), and their votes from before, counted
        with this worker's next one, marked it forgotten while they still
        had it. Whether anything was written."""
        wrote = False
        undo = port in self.forgotten and not self._draining()
        voters = self.voted.get(port, set())
        for worker in sorted(voters if undo else voters & {self._worker}):
            assert self._votes is not None  # (only a worker's journal has votes)
            self._votes.append(f"{port} -{worker}")
            wrote = True
        if undo:
            self._journal.append(f"{port} {broker.host.lower()} {broker.port} {kind}")
            wrote = True
        return wrote

    def has_voted(self, port: int) -> bool:
        """Whether this worker has forgotten the broker of ``port`` (and
        not been asked for it since)."""
        return self._votes is not None and self._worker in self.voted.get(port, ())

    def forget(self, broker: Address, kind: str = PLAIN) -> bool:
        """``broker`` was forgotten here: its port of ``kind`` (kept its
        own) is marked forgotten, relaying no more, when every worker has
        forgotten it (``share_forgetting``), or at once in a journal this
        process holds alone (``held``: a lone proxy's, so that a restart
        does not listen for it again). A worker's journal without
        ``share_forgetting`` is left as it is, as one that drains is.
        Whether the port is forgotten now."""
        key = (Address(broker.host.lower(), broker.port), kind)
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            self.refresh()
            port = self.by_broker.get(key)
            if port is None or port in self.forgotten or self._draining():
                return False
            if self._votes is not None:
                if self._worker not in self.voted.get(port, ()):
                    self._votes.append(f"{port} {self._worker}")
                    self.refresh()
                if not set(range(self._workers)) <= self.voted.get(port, set()):
                    return False  # another worker still has it
            elif not self.held:
                return False
            self._journal.append(f"{port} {key[0].host} {key[0].port} {kind} forgotten")
            self.refresh()
            return port in self.forgotten
        finally:
            if self._lock is not None:
                fcntl.flock(self._lock, fcntl.LOCK_UN)

    def port_of(self, broker: Address, kind: str = PLAIN) -> int | None:
        """The port of kind ``kind`` ``broker`` was given, if any (by anyone, so far)."""
        self.refresh()
        return self.by_broker.get((Address(broker.host.lower(), broker.port), kind))

    def broker_for(self, port: int) -> tuple[Address, str] | None:
        """The broker ``port`` stands for and the port's kind, if any worker
        has given it one and it is not forgotten (what others wrote read
        first: a read of the journal's end, for each connection)."""
        self.refresh()
        if port in self.forgotten:
            return None
        return self.by_port.get(port)

    def refresh(self) -> None:
        if self._votes is not None:
            for words in self._votes.new_lines():
                if len(words) != 2 or not _PORT.fullmatch(words[0]):
                    continue
                port, who = int(words[0]), words[1]
                if who.isdigit():
                    self.voted.setdefault(port, set()).add(int(who))
                elif who[:1] == "-" and who[1:].isdigit():
                    self.voted.get(port, set()).discard(int(who[1:]))
        for parts in self._journal.new_lines():
            self._lines += 1
            if not parts:
                continue
            problem = self._problem(parts)
            if problem is not None:  # not written by assign(): never trusted
                if self.warn:
                    log.warning("%s, line %d (%s): ignored: %s", self.path, self._lines,
                                " ".join(parts)[:80], problem)  # fmt: skip
                continue
            if len(parts) == 3:
                parts = [*parts, self.main_kind]
            port, broker, kind = int(parts[0]), Address(parts[1], int(parts[2])), parts[3]
            if len(parts) == 5:  # forgotten: only if it still stands for that broker
                if self.by_port.get(port) == (broker, kind):
                    self.forgotten.add(port)
                continue
            self.forgotten.discard(port)
            earlier = self.by_port.get(port)
            if earlier is not None and self.by_broker.get(earlier) == port:
                del self.by_broker[earlier]  # a port stands for one broker: the latest
            self.by_port[port] = (broker, kind)
            self.by_broker[(broker, kind)] = port

    def _problem(self, parts: list[str]) -> str | None:
        """Why a journal line (split into words) is not one ``assign`` writes."""
        if len(parts) not in (3, 4, 5) or not (
            _PORT.fullmatch(parts[0]) and _PORT.fullmatch(parts[2])
        ):
            return "not PORT HOST BROKER_PORT KIND"
        if len(parts) == 5 and parts[4] != "forgotten":
            return f"{parts[4]!r} is not 'forgotten'"
        if len(parts) >= 4 and parts[3] not in KINDS:
            return f"kind {parts[3]!r} is not one of {', '.join(KINDS)}"
        port, broker_port = int(parts[0]), int(parts[2])
        if not 0 < broker_port < 65536:
            return f"broker port {broker_port} is not 1-65535"
        if not 0 < port < 65536:
            return f"port {port} is not 1-65535"
        if self.span is not None and not self.span[0] <= port <= self.span[1]:
            return f"port {port} is outside --listener-ports {self.span[0]}-{self.span[1]}"
        return None

    def close(self) -> None:
        if self._lock is not None and self._lock != self._journal.fd:
            os.close(self._lock)
        if self._votes is not None:
            self._votes.close()
        self._journal.close()


# A port as a journal line writes it (str.isdigit would take "4000²",
# which int() refuses).
_PORT = re.compile(r"[0-9]{1,5}")


# A worker's forgetting in the routes journal: HOST PORT forgotten by W.
_FORGOTTEN_BY = ["forgotten", "by"]
# The supervisor's clock in the routes journal, every MARK_EVERY seconds:
# "@ SECONDS", on time.monotonic's clock (CLOCK_MONOTONIC: the same in every
# process of the machine, whatever the wall clock does).
_MARK = "@"
MARK_EVERY = 60.0


def mark_time(directory: Path, now: float | None = None) -> None:
    """The supervisor's, at start and every ``MARK_EVERY``: the time
    (``now``; None: ``time.monotonic()``) written in the routes journal of
    ``directory``, which dates the lines around it for a worker started
    later (``ForgottenRoutes.read``)."""
    when = time.monotonic() if now is None else now
    fd = os.open(directory / ROUTES_FILE, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, f"{_MARK} {when:.3f}\n".encode())
    finally:
        os.close(fd)


def _route_key(host: str, port: str) -> Address:
    """A broker of the routes journal, as routing tells brokers apart."""
    return Address(host.lower(), int(port))


class ForgottenRoutes:
    """With ``--workers``: which brokers learned in the routes journal
    (``ROUTES_FILE``: lines ``HOST PORT TLS VIA``, Pulsar's
    ``SharedRouting``) each worker has forgotten, written in that journal as
    ``HOST PORT forgotten by W`` (five words: a routing, which reads lines
    of four, passes over them). A line learning the broker again (named
    again, anywhere, which every worker takes in) takes back the
    forgetting written before it. A worker started in a dead one's place
    reads the journal from its start: a broker every other worker has
    forgotten since it was last learned is not trusted again, and the
    others are dated by the supervisor's clock marks (``read``;
    ``sluice/proxy/workers.py``, ``share_forgetting``)."""

    def __init__(self, journal: Path, worker: int, workers: int) -> None:
        self.path = journal
        self.worker = worker
        self.workers = workers
        self._journal = Journal(journal)

    def forgot(self, broker: Address) -> None:
        """This worker has forgotten ``broker``."""
        host = broker.host.lower()
        if host and host.split() == [host]:  # (what a line can hold)
            self._journal.append(f"{host} {broker.port} {' '.join(_FORGOTTEN_BY)} {self.worker}")

    def read(self) -> tuple[list[Address], dict[Address, float]]:
        """From the journal's start: the brokers every other worker has
        forgotten since a line last learned them; and when each broker was
        last learned, as the supervisor's clock marks (``mark_time``) date
        it: by the first mark after the line, on ``time.monotonic``'s
        clock (none for one learned since the last mark: just now)."""
        votes: dict[Address, set[int]] = {}
        learned: dict[Address, float] = {}
        unmarked: set[Address] = set()
        with open(self.path, "rb") as handle:
            for raw in handle:
                words = raw.decode(errors="replace").split()
                if len(words) == 2 and words[0] == _MARK:
                    with contextlib.suppress(ValueError):
                        mark = float(words[1])
                        learned.update(dict.fromkeys(unmarked, mark))
                        unmarked.clear()
                    continue
                if len(words) < 4 or not _PORT.fullmatch(words[1]):
                    continue
                key = _route_key(words[0], words[1])
                if len(words) == 4:  # learned (again): trusted by every worker
                    votes.pop(key, None)
                    learned.pop(key, None)
                    unmarked.add(key)
                elif words[2:4] == _FORGOTTEN_BY and len(words) == 5 and words[4].isdigit():
                    votes.setdefault(key, set()).add(int(words[4]))
        others = set(range(self.workers)) - {self.worker}
        return [broker for broker, who in votes.items() if who and others <= who], learned

    def close(self) -> None:
        self._journal.close()


def learned_from_ports_file(
    directory: Path, ports_file: Path, span: tuple[int, int] | None, tls: bool
) -> list[Address]:
    """The supervisor's, at start: the brokers ``ports_file`` (an earlier
    run's ``--broker-ports-file``) gives a port and has not marked
    forgotten, written in the routes journal of ``directory`` as learned
    (dialled with TLS as ``tls`` says, not chained), so that every worker
    forgets them as it forgets a broker it learned, once no answer has
    named them for as long, and no connection to them is open: without
    this no routing ever learned them, and their ports relayed to them for
    ever. Those written."""
    kept = SharedBrokerPorts(ports_file, span=span, warn=False)
    try:
        kept.refresh()
        brokers = sorted(
            {broker for (broker, _), port in kept.by_broker.items() if port not in kept.forgotten},
            key=str,
        )
    finally:
        kept.close()
    if brokers:
        with open(directory / ROUTES_FILE, "a") as routes:
            routes.writelines(f"{b.host} {b.port} {int(tls)} 0\n" for b in brokers)
    return brokers


class LocalLimits:
    """Connection counts of one process."""

    def __init__(self, total: int, per_ip: int) -> None:
        self.total = total
        self.per_ip = per_ip
        self.active = 0
        self._per_ip: collections.Counter[str] = collections.Counter()

    def acquire(self, ip: str) -> str | None:
        """Count a new connection from ``ip``; why not, when over a limit.
        (An IPv4 client is counted as one however its address is written:
        ``client_host``.)"""
        ip = client_host(ip)
        if self.active >= self.total:
            return "too many connections"
        if self._per_ip[ip] >= self.per_ip:
            return f"too many connections from {ip}"
        self.active += 1
        self._per_ip[ip] += 1
        return None

    def release(self, ip: str) -> None:
        ip = client_host(ip)
        self.active -= 1
        self._per_ip[ip] -= 1
        if not self._per_ip[ip]:
            del self._per_ip[ip]


class SharedLimits(LocalLimits):
    """Connection counts summed over every worker (see the module's notes)."""

    def __init__(self, total: int, per_ip: int, table: Path, worker: int, workers: int) -> None:
        super().__init__(total, per_ip)
        self.workers = workers
        with open(table, "r+b") as handle:
            self._map = mmap.mmap(handle.fileno(), table_size(workers))
        self._counts = memoryview(self._map).cast("q")
        self._row = worker * (BUCKETS + 1)

    def acquire(self, ip: str) -> str | None:
        ip = client_host(ip)
        bucket = 1 + zlib.crc32(ip.encode()) % BUCKETS
        counts = self._counts
        stride = BUCKETS + 1
        rows = range(0, self.workers * stride, stride)
        if sum(counts[row] for row in rows) >= self.total:
            return "too many connections"
        if sum(counts[row + bucket] for row in rows) >= self.per_ip:
            return f"too many connections from {ip}"
        counts[self._row] += 1
        counts[self._row + bucket] += 1
        self.active += 1
        return None

    def release(self, ip: str) -> None:
        bucket = 1 + zlib.crc32(client_host(ip).encode()) % BUCKETS
        self._counts[self._row] -= 1
        self._counts[self._row + bucket] -= 1
        self.active -= 1

    def reset_row(self) -> None:
        """A worker starting in a dead one's place begins from zero."""
        stride = BUCKETS + 1
        self._counts[self._row : self._row + stride] = memoryview(bytes(stride * _SLOT)).cast("q")


def clear_row(table: Path, worker: int) -> None:
    """A dead worker's row of ``table`` set to zero, by its supervisor: its
    connections are gone with it, and until a worker starting in its place
    resets the row (``SharedLimits.reset_row``; after a pause when workers
    keep dying) they would count against the limits of the others. A
    failed write (an I/O error) is logged: the supervisor, and the workers
    with it, must not end for it."""
    stride = (BUCKETS + 1) * _SLOT
    try:
        fd = os.open(table, os.O_WRONLY)
        try:
            os.pwrite(fd, bytes(stride), worker * stride)
        finally:
            os.close(fd)
    except FileNotFoundError:  # not made yet, or the state let go
        return
    except OSError as exc:
        log.warning("worker %d's row of %s not cleared (%s): its connections count against "
                    "the limits until a worker starts in its place", worker, table,
                    exc.strerror or exc)  # fmt: skip


def table_size(workers: int) -> int:
    return workers * (BUCKETS + 1) * _SLOT


def create_state(directory: Path, workers: int) -> None:
    """The files a supervisor creates for its workers."""
    (directory / ROUTES_FILE).touch(mode=0o600)
    (directory / BROKER_PORTS_FILE).touch(mode=0o600)
    (directory / BROKER_PORTS_VOTES).touch(mode=0o600)
    for name in (LIMITS_FILE, HTTP_LIMITS_FILE):
        with open(directory / name, "wb") as handle:
            handle.truncate(table_size(workers))
