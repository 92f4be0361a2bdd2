"""``sluice demo``: the embedded broker, Sluice in front of it, real traffic, a report.

Needs the official client and the embedded broker (``pip install
'sluice[demo]'``; ``./dev demo`` sets everything up). ``--embedded
apache-pulsar`` runs the same demo in front of Apache Pulsar itself, fetched
with Maven the first time (needs Java 17 and Maven).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from sluice.addresses import Address
from sluice.brokers import Broker
from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.brokers.embedded import BrokerError, EmbeddedBroker, free_port
from sluice.commands.proxy import StartupError, listen_error
from sluice.config import port
from sluice.errors import leaves
from sluice.extras import need_extra
from sluice.logs import setup_logging
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ListenError, ProxyConfig
from sluice.proxy.server import Proxy
from sluice.recording.format import PayloadPolicy
from sluice.recording.writer import RecorderConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--messages",
        type=int,
        default=200,
        metavar="N",
        help="messages to send (half one by one, half batched)",
    )
    parser.add_argument(
        "--record",
        type=Path,
        metavar="DIR",
        help="where to keep the recording (default: a new temporary directory)",
    )
    parser.add_argument(
        "--port", type=port, default=0, metavar="PORT", help="proxy port (default: a free one)"
    )
    parser.add_argument(
        "--admin-port",
        type=port,
        default=0,
        metavar="PORT",
        help="metrics port (default: a free one)",
    )
    parser.add_argument(
        "--keep-running", action="store_true", help="leave broker and proxy up until Ctrl-C"
    )
    parser.add_argument(
        "--embedded",
        choices=sorted(BROKERS),
        nargs="?",
        const="pulsar-lite",
        default="pulsar-lite",
        help="the broker the demo starts: pulsar-lite (quick, no Java) or Apache Pulsar "
        "itself (Java 17 and Maven; about 240 MB fetched once into ~/.cache/sluice); "
        "--embedded alone is pulsar-lite (default: %(default)s)",
    )


BROKERS: dict[str, Callable[[], EmbeddedBroker | ApachePulsar]] = {
    "pulsar-lite": lambda: EmbeddedBroker(port=None, die_with_parent=True),
    "apache-pulsar": lambda: ApachePulsar(say=_say, die_with_parent=True),
}


@dataclass
class Workload:
    sent: int = 0
    received: int = 0
    in_order: bool = True
    latencies: list[float] = field(default_factory=list)
    error: str = ""


# How long a blocking call of the workload waits before it looks whether it
# should stop (Ctrl-C, SIGTERM, SIGHUP).
POLL = 0.25


class Receipts:
    """What the client answers for each batched send: a send is sent only
    once the broker confirmed it; a failed one (a full queue, a timeout) is
    said, not counted."""

    def __init__(self) -> None:
        self.done = threading.Semaphore(0)  # released once per answer
        self.failed: list[str] = []
        self.ok = 0  # sends the broker confirmed so far

    def answered(self, result: Any, message_id: Any) -> None:
        import pulsar

        if result != pulsar.Result.Ok:
            self.failed.append(str(result))
        else:
            self.ok += 1
        self.done.release()

    def problem(self) -> str:
        return f"{len(self.failed)} batched sends failed ({self.failed[0]})"


class ClientLog:
    """Where the official client logs its errors: a file, said on stderr
    (the demo's diagnostics), each line as ``[client] ...``, by
    :meth:`forward`. Its ConsoleLogger writes to stdout, which is the
    demo's report's (piped, saved); and a client left behind, stuck, goes
    on logging while the demo stops, so its lines are said when asked."""

    SHOWN = 20  # lines said per forward(); the rest counted

    def __init__(self) -> None:
        self.path: Path | None = None  # (no temporary file to be had: not logged)
        with contextlib.suppress(OSError):
            fd, name = tempfile.mkstemp(prefix="sluice-demo-client-", suffix=".log")
            os.close(fd)
            self.path = Path(name)
        self._read = 0  # bytes of it said so far

    def forward(self, say: Callable[[str], None] = lambda text: None) -> None:
        """Say the complete lines logged since the last call."""
        if self.path is None:
            return
        try:
            with open(self.path, "rb") as log:
                log.seek(self._read)
                new = log.read()
        except OSError:
            return
        new = new[: new.rfind(b"\n") + 1]  # a line being written: next time
        self._read += len(new)
        lines = new.decode(errors="replace").splitlines()
        for line in lines[: self.SHOWN]:
            print(f"[client] {line}", file=sys.stderr, flush=True)
        if len(lines) > self.SHOWN:
            say(f"the client logged {len(lines) - self.SHOWN} more line(s), not shown")

    def close(self, say: Callable[[str], None] = lambda text: None) -> None:
        """Say what is left, and remove the file."""
        self.forward(say)
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()


def run_workload(
    url: str,
    count: int,
    say: Any,
    stop: threading.Event | None = None,
    result: Workload | None = None,
    log: Path | None = None,
) -> Workload:
    """Produce and consume through the proxy with the official client;
    ``stop``, once set, ends it between two sends or receives (the client
    closed). ``result``, where given, is filled in as it goes (what was
    sent and received so far, for a caller that stops waiting for it).
    The client logs its errors to the file ``log`` (None: nowhere)."""
    import pulsar

    stop = stop or threading.Event()
    result = result if result is not None else Workload()
    topic = f"persistent://public/default/sluice-demo-{int(time.time())}"
    logger = pulsar.FileLogger(pulsar.LoggerLevel.Error, str(log or os.devnull))
    client = pulsar.Client(url, operation_timeout_seconds=15, logger=logger)
    try:
        single = count // 2
        producer = client.create_producer(topic, batching_enabled=False)
        say(f"sending {single} messages one by one ...")
        for i in range(single):
            if stop.is_set():
                return result
            started = time.perf_counter()
            producer.send(f"demo message {i}".encode())
            result.latencies.append(time.perf_counter() - started)
            result.sent += 1
        # Waits for room in the client's queue (1000 messages) rather than
        # failing the sends past it.
        batched = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=50, block_if_queue_full=True
        )
        say(f"sending {count - single} messages in batches ...")
        receipts = Receipts()
        for i in range(single, count):
            if stop.is_set():
                result.sent = single + receipts.ok  # those confirmed by now
                return result
            batched.send_async(f"demo message {i}".encode(), receipts.answered)
        batched.flush()
        for _ in range(single, count):
            deadline = time.monotonic() + 30
            while not receipts.done.acquire(timeout=POLL):
                result.sent = single + receipts.ok
                if stop.is_set():
                    return result
                if time.monotonic() >= deadline:
                    raise TimeoutError("a batched send was not confirmed within 30 s")
        result.sent = single + receipts.ok
        if receipts.failed:
            # Only what was sent can be received: say so, rather than wait for the rest.
            result.error = receipts.problem()
            return result
        say(f"receiving {count} messages ...")
        consumer = client.subscribe(topic, "demo", initial_position=pulsar.InitialPosition.Earliest)
        seen: set[str] = set()
        expected = 0
        while len(seen) < count:
            deadline = time.monotonic() + 15
            while True:
                if stop.is_set():
                    return result
                try:
                    msg = consumer.receive(timeout_millis=int(POLL * 1000))
                    break
                except pulsar.Timeout:
                    if time.monotonic() >= deadline:
                        raise
            consumer.acknowledge(msg)
            if str(msg.message_id()) in seen:
                continue  # pulsar-lite may deliver an entry twice
            seen.add(str(msg.message_id()))
            result.in_order &= msg.data() == f"demo message {expected}".encode()
            expected += 1
            result.received = len(seen)
        result.received = len(seen)
    except Exception as exc:
        result.error = str(exc)
    finally:
        client.close()
    return result


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


# The signals that end the demo as Ctrl-C does: the broker stopped and its
# data removed however the demo is ended (a terminal closed, a service stop).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The demo's flags for the proxy's ports, for a port that cannot be listened on.
DEMO_FLAGS = {"--listen": "--port", "--admin": "--admin-port"}


async def demo(
    args: argparse.Namespace,
    broker: Broker,
    record: Path,
    idle: threading.Event | None = None,
    client_log: ClientLog | None = None,
) -> int:
    """``idle``, where given, is cleared while the workload's thread runs
    and set once it has ended (it may outlive this, left behind).
    ``client_log``: where the client logs, said once the workload ends."""
    say = _say
    idle = idle or threading.Event()
    port = args.port or free_port()
    admin = args.admin_port or free_port()
    config = ProxyConfig(
        broker=parse_broker_url(broker.url),
        listen=Address("127.0.0.1", port),
        admin=Address("127.0.0.1", admin),
        record=RecorderConfig(record, payloads=PayloadPolicy.FULL, flush_interval=0.2),
        drain_timeout=5.0,
    )
    stop = threading.Event()  # the workload's thread looks at it between calls
    stopped = trio.Event()
    received: list[int] = []
    workload = trio.CancelScope()

    async def until_signalled(signals: Any) -> None:
        async for signum in signals:
            received.append(signum)
            stop.set()
            stopped.set()
            # The workload stops within POLL; one stuck in the client is left behind.
            workload.deadline = min(workload.deadline, trio.current_time() + 5)
            return

    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
            nursery.start_soon(until_signalled, signals)
            try:
                proxy: Proxy = await nursery.start(Proxy(config).run)
            except OSError as exc:
                raise StartupError(listen_error(exc, config, DEMO_FLAGS)) from None
            url = f"pulsar://127.0.0.1:{port}"
            say(f"broker  {broker.url}  (embedded {args.embedded}, pid {broker.pid})")
            say(f"proxy   {url}  (clients connect here)")
            # Filled in as it goes: what it did so far, should it be left behind.
            work = Workload()

            def working() -> Workload:
                try:
                    log = client_log.path if client_log else None
                    return run_workload(url, args.messages, say, stop, work, log)
                finally:
                    idle.set()

            idle.clear()
            with workload:
                work = await trio.to_thread.run_sync(working, abandon_on_cancel=True)
            interrupted = bool(received)  # before the report: the workload was cut short
            if client_log:  # what it logged, before the report (or the rest of it, later)
                client_log.forward(say)
            if not interrupted:
                await trio.sleep(0.5)  # let the recorder flush
                report(work, proxy, record, url, admin, args.keep_running, args.embedded)
                if args.keep_running:
                    say(f"broker and proxy are up (clients: {url}); press Ctrl-C to stop")
                    await stopped.wait()
            else:
                name = signal.Signals(received[0]).name
                say(f"{name}: stopped after sending {work.sent} and receiving {work.received}; "
                    f"the recording so far is in {record}")  # fmt: skip
            await proxy.drain()
            nursery.cancel_scope.cancel()
    if interrupted:
        return 128 + received[0]
    return 0 if not work.error and work.received == work.sent == args.messages else 1


def report(
    work: Workload, proxy: Proxy, record: Path, url: str, admin: int, live: bool, embedded: str
) -> None:
    registry = proxy.metrics.registry
    proxy.metrics.absorb()
    frames = sum(sum(counts) for counts in proxy.metrics.traffic.frames)
    invalid = sum(
        s.value
        for metric in registry.collect()
        if metric.name == "sluice_validation_failures"
        for s in metric.samples
        if s.name.endswith("_total")
    )
    lookups = registry.get_sample_value("sluice_lookups_total", {"outcome": "answered"}) or 0
    recorder = proxy.recorder
    files = len(recorder.files) if recorder else 0
    written = recorder.frames_written if recorder else 0
    out = sys.stdout
    out.write("\nSluice demo: what happened\n")
    if work.error:
        out.write(f"  FAILED: {work.error}\n")
    order = "in order" if work.in_order else "NOT in order"
    out.write(f"  messages       sent {work.sent}, received {work.received}, {order}\n")
    if work.latencies:
        p50 = statistics.median(work.latencies)
        p99 = statistics.quantiles(work.latencies, n=100)[98] if len(work.latencies) > 1 else p50
        out.write(f"  send latency   p50 {_ms(p50)}, p99 {_ms(p99)} (client, through the proxy)\n")
    out.write(f"  frames         {frames} decoded and validated, {int(invalid)} invalid\n")
    out.write(f"  lookups        {int(lookups)} answered, clients kept on the proxy\n")
    out.write(f"  recording      {record}  ({files} file(s), {written} frames, payloads kept)\n")
    metrics_note = "" if live else "  (while running: add --keep-running)"
    out.write(f"  metrics        http://127.0.0.1:{admin}/metrics{metrics_note}\n")
    out.write("\nTry next:\n")
    for command, note in next_steps(record, url, live, embedded):
        out.write(f"  {command:<{STEP_WIDTH}}  # {note}\n" if note else f"  {command}\n")
    out.flush()


# Where the notes of the report's "Try next" lines start (a longer command pushes its note on).
STEP_WIDTH = 48


def next_steps(
    record: Path, url: str, live: bool, embedded: str = "pulsar-lite"
) -> list[tuple[str, str]]:
    """The report's "Try next" commands, each with a note, for a recording
    in ``record`` and the proxy at ``url`` in front of the ``embedded``
    broker; ``live``: broker and proxy stay up (``--keep-running``), so the
    commands that need a broker use them."""
    where = shlex.quote(str(record))
    port = url.rsplit(":", 1)[1]
    steps = [
        (f"sluice inspect {where}", ""),
        (f"sluice inspect {where} --summary", ""),
        (f"sluice inspect {where} --pcap demo.pcapng", "then open it in Wireshark"),
        (f"sluice view {where}", "in the browser, http://127.0.0.1:8088/"),
    ]
    if live:
        steps.append((f"sluice replay {where} --broker {url}", "again, through this proxy"))
    else:
        steps.append((f"sluice replay {where} --broker pulsar://HOST:PORT", "against a broker"))
    steps.append((f"sluice serve {where}", "a stand-in broker on pulsar://127.0.0.1:6650"))
    if not live:
        # The same broker and port again, so that the URL said here is the one to use.
        broker = "" if embedded == "pulsar-lite" else f" --embedded {embedded}"
        again = f"sluice demo{broker} --keep-running --port {port}"
        steps.append((again, f"then point a client at {url}"))
    return steps


def _say(text: str) -> None:
    print(f"[demo] {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    idle = threading.Event()  # the workload's thread has ended (or never ran)
    idle.set()
    client_log = ClientLog()
    try:
        code = _run(args, idle, client_log)
    finally:
        # The rest of what the client logged (one left behind goes on
        # while the broker and the proxy stop), on stderr.
        client_log.close(_say)
    if not idle.is_set():
        # The client's thread was left behind, stuck in the official client
        # (a broker that answers nothing): the interpreter's exit would tear
        # the C++ client down under it ("terminate called without an active
        # exception", SIGABRT). Broker and proxy are stopped by now: leave.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    return code


def _run(args: argparse.Namespace, idle: threading.Event, client_log: ClientLog) -> int:
    setup_logging("warning")
    if not need_extra("demo", "demo"):
        return 2
    if args.messages < 2:
        print("sluice demo: --messages must be at least 2", file=sys.stderr)
        return 2
    if args.port and args.port == args.admin_port:
        print("sluice demo: --port and --admin-port must differ", file=sys.stderr)
        return 2
    if args.record is not None and args.record.exists() and not args.record.is_dir():
        print(f"sluice demo: --record {args.record}: exists and is not a directory",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.record is not None:
        try:  # before the broker starts: a --record that cannot be is a mistake, said as one
            args.record.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"sluice demo: --record {args.record}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    for flag, asked in (("--port", args.port), ("--admin-port", args.admin_port)):
        # Before the broker starts (Apache Pulsar: seconds to a minute): a
        # port asked for that is taken is said now, as the proxy would say it.
        problem = _cannot_listen(flag, asked)
        if problem:
            print(f"sluice demo: {problem}", file=sys.stderr)
            return 1
    _say(f"starting the embedded broker ({args.embedded}) ...")
    with contextlib.ExitStack() as stack:
        stack.callback(logging.shutdown)
        # SIGTERM and SIGHUP end the demo as Ctrl-C does, before trio runs
        # too (while the broker starts): the stack below is unwound, so the
        # broker is stopped and its data removed. (trio's signal receiver
        # takes them over while the demo runs.)
        for signum in STOP_SIGNALS[1:]:
            stack.callback(signal.signal, signum, signal.signal(signum, _interrupt))
        try:
            broker = BROKERS[args.embedded]()
            stack.push(broker)  # stopped (and its data removed) however we leave
            broker.start()
        except BrokerError as exc:
            print(f"sluice demo: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        record = args.record
        if record is None:  # a new directory, removed again if nothing is recorded in it
            record = Path(tempfile.mkdtemp(prefix="sluice-demo-"))
            stack.callback(_remove_if_empty, record)
        try:
            return trio.run(demo, args, broker, record, idle, client_log)
        except KeyboardInterrupt:
            return 130
        except Exception as exc:  # trio wraps what its tasks raise in groups
            found = [e for e in leaves(exc) if isinstance(e, OSError | StartupError)]
            if not found:
                raise
            if isinstance(found[0], BrokenPipeError):
                raise found[0] from None  # the report's reader left (`| head`): main's to say
            print(f"sluice demo: {found[0]}", file=sys.stderr)
            return 1


def _cannot_listen(flag: str, asked: int) -> str:
    """Why the proxy could not listen on 127.0.0.1:``asked`` (``flag``'s
    port; 0: one drawn free later), or "" where it can now. Bound as the
    proxy binds (SO_REUSEADDR: a port in TIME_WAIT is no problem)."""
    if not asked:
        return ""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", asked))
        except OSError as exc:
            return str(ListenError(flag, Address("127.0.0.1", asked), exc))
    return ""


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):
        directory.rmdir()
