"""Instructions the whole proxy process spends per relayed message, counted by valgrind.

    python bench/instructions.py [--against DIR] [--messages 2000,6000]
                                 [--only produce|consume|along|floor] [--no-record]
                                 [--seconds 20] [--syscalls]

Seconds on a shared 2-core VM swing by a third between identical runs;
instruction counts do not. This runs ``sluice proxy`` under
``valgrind --tool=callgrind`` in front of an embedded pulsar-lite broker,
and the official client sends (``produce``) or receives (``consume``) 1 KiB
unbatched messages through it, as ``bench/e2e.py`` does. Each count is of a
fresh proxy from start to exit; two message counts are taken and the
difference is divided by the difference in messages, so start-up and
shut-down cancel out.

``--only along`` is the low-rate case of a sidecar, where every frame
crosses the proxy on its own: the client produces at a fixed rate with a
consumer reading along, and only the paced window is counted (callgrind
zeroed at its start and dumped at its end, with ``callgrind_control``).
Both counts take the same ``--seconds``, N1 and N2 messages spread over
it, so that what the proxy does by the clock (its broker probe every 5 s,
keepalives) cancels out too; under valgrind the proxy is some 50 times
slower, so the rates stay low (the defaults: 5 and 15 a second).

``--only floor`` counts the floor of that design instead of the proxy: the
least a trio program can do to carry a read across, as the relay does on a
plain socket (wait until readable, ``os.read``, ``os.write`` on), two tasks
relaying 1 KiB back and forth; the count is per crossing, not per message
(at low rates a message is about four crossings: SEND, SEND_RECEIPT,
MESSAGE, ACK).

Everything the proxy does is counted: trio's
sockets, the writer thread, metrics, recording (on, payloads hashed,
unless ``--no-record``).

What it cannot show: the kernel's share (sockets, page faults) and what a
busy machine's caches add per instruction. valgrind also runs SHA-256
without the CPU's SHA extensions, so recorded payloads count high.
``--against DIR`` (a worktree of another commit) counts that proxy too, in
the same run.

``--syscalls`` counts the kernel calls of ``--only along`` instead: the
proxy runs as it does in production (no valgrind) with ``strace -f -c``
attached for the paced window only, and each call's count per message is
the difference between the two message counts over the difference in
messages (defaults 1000,3000 over the window). Instructions cannot show a
call that does nothing for the message (a wake-up with nobody to wake):
this can. Needs strace. Needs valgrind (``./dev bench`` installs it); about a minute
per count.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench
from bench import e2e
from bench.peers import strace_counts
from sluice.brokers.embedded import EmbeddedBroker, free_port, wait_for_port
from tests.helpers import support
from tests.helpers.support import describe_source, source_error, start_proxy

START_TIMEOUT = 180.0  # seconds for a proxy under valgrind to listen
SUMMARY = re.compile(rb"^summary: (\d+)$", re.M)


class CallgrindWindow:
    """Zeroes a callgrind run's counters, later dumps them (to OUT.1)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __call__(self, start: bool) -> None:
        action = "--zero" if start else "--dump=window"
        done = subprocess.run(
            ["callgrind_control", action, str(self.pid)], capture_output=True, text=True
        )
        if done.returncode != 0 or "OK" not in done.stdout:
            raise SystemExit(f"callgrind_control {action} failed: {done.stdout}{done.stderr}")


def count(
    broker: EmbeddedBroker,
    tmp: Path,
    source: Path,
    step: str,
    messages: int,
    record: bool,
    seconds: float,
) -> int:
    """Instructions of one proxy's whole life, relaying ``messages`` messages;
    for ``along``, of its paced window only."""
    out = tmp / f"callgrind-{time.monotonic_ns()}.out"
    # The command's module: sluice/__main__.py, or sluice/cli.py in a tree older than it.
    module = "sluice" if (source / "sluice" / "__main__.py").exists() else "sluice.cli"
    support.SLUICE = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                      sys.executable, "-m", module]  # fmt: skip
    extra = ["--record", str(tmp / f"rec-{out.stem}")] if record else []
    # The same hash seed each time: dict and set layouts, so the same work.
    os.environ["PYTHONHASHSEED"] = "0"
    proxy = start_proxy(broker.url, tmp, *extra, source=source, wait=False)
    try:
        wait_for_port("127.0.0.1", proxy.port, START_TIMEOUT, proxy.process)
        topic = f"persistent://public/default/instructions-{time.monotonic_ns()}"
        if step == "produce":
            e2e.produce(proxy.url, topic, messages, 1024, False)
        elif step == "along":
            window = CallgrindWindow(proxy.process.pid)
            e2e.along(proxy.url, topic, messages, 1024, messages / seconds, window)
        else:
            e2e.produce(broker.url, topic, messages, 1024, False)
            e2e.consume(proxy.url, topic, messages)
        status = proxy.terminate(timeout=START_TIMEOUT)
    finally:
        proxy.kill()
        os.environ.pop("PYTHONHASHSEED", None)
    if status != 0:
        raise SystemExit(f"the proxy under valgrind exited with {status}:\n{proxy.log()[-2000:]}")
    if step == "along":
        out = out.with_name(out.name + ".1")  # the window's dump
    found = SUMMARY.search(out.read_bytes())
    if found is None:
        raise SystemExit(f"{out}: no callgrind summary line")
    return int(found.group(1))


class StraceWindow:
    """strace -f -c attached to a process from ``window(True)`` to
    ``window(False)``; ``calls`` then holds each call's count."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid = pid
        self.out = out
        self.tracer: subprocess.Popen[bytes] | None = None
        self.calls: dict[str, int] = {}

    def __call__(self, start: bool) -> None:
        if start:
            self.tracer = subprocess.Popen(
                ["strace", "-f", "-c", "-o", str(self.out), "-p", str(self.pid)],
                stderr=subprocess.PIPE,
            )
            # Attached once it names the process's threads on its stderr.
            assert self.tracer.stderr is not None
            attached = self.tracer.stderr.readline().decode()
            if "attached" not in attached:
                raise SystemExit(f"strace could not attach to {self.pid}: {attached.strip()}")
            return
        assert self.tracer is not None
        self.tracer.send_signal(signal.SIGINT)
        self.tracer.wait(timeout=60)
        self.calls = strace_counts(self.out.read_text())


def calls(
    broker: EmbeddedBroker, tmp: Path, source: Path, messages: int, seconds: float
) -> dict[str, int]:
    """Kernel calls of one proxy (no valgrind) in the paced window of
    ``along``, by name."""
    support.SLUICE = [sys.executable, "-m", "sluice"]
    proxy = start_proxy(broker.url, tmp, source=source)
    try:
        window = StraceWindow(proxy.process.pid, tmp / f"strace-{time.monotonic_ns()}.out")
        topic = f"persistent://public/default/syscalls-{time.monotonic_ns()}"
        e2e.along(proxy.url, topic, messages, 1024, messages / seconds, window)
        status = proxy.terminate(timeout=60)
    finally:
        proxy.kill()
    if status != 0:
        raise SystemExit(f"the proxy exited with {status}:\n{proxy.log()[-2000:]}")
    return window.calls


def syscalls_main(args: argparse.Namespace, sources: dict[str, Path], low: int, high: int) -> int:
    found: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        for name, source in sources.items():
            counts = []
            for messages in (low, high):
                counts.append(calls(broker, Path(tmp), source, messages, args.seconds))
                print(f"{name} along {messages:,} messages: {sum(counts[-1].values()):,} calls",
                      file=sys.stderr)  # fmt: skip
            names = set(counts[0]) | set(counts[1])
            found[name] = {n: (counts[1].get(n, 0) - counts[0].get(n, 0)) / (high - low)
                           for n in names}  # fmt: skip
    here = sources["proxy"]
    print(f"proxy: sluice from {describe_source(here)}")
    if "against" in sources:
        print(f"against: sluice from {describe_source(sources['against'])}")
    print(f"kernel calls per message (strace -f -c), 1 KiB unbatched, paced over "
          f"{args.seconds:g} s with a consumer along, from {low:,} and {high:,} "
          "messages")  # fmt: skip
    mine, other = found["proxy"], found.get("against") or {}
    shown = sorted(set(mine) | set(other), key=lambda n: -max(mine.get(n, 0), other.get(n, 0)))
    against = "against" in sources
    rows = [("total", sum(mine.values()), sum(other.values()) if against else None)]
    rows += [(n, mine.get(n, 0.0), other.get(n, 0.0) if against else None) for n in shown]
    for call, value, theirs in rows:
        if abs(value) < 0.005 and (theirs is None or abs(theirs) < 0.005):
            continue
        line = f"{call:<16} {value:>8.2f}"
        if theirs is not None:
            line += f"   against {theirs:>8.2f}"
        print(line)
    return 0


# What both minimal relays share: the two connections, and their start.
_FLOOR_CONNECT = """
import functools, os, socket, sys, trio
def connect(listen, upstream):
    client, _ = listen.accept()
    broker = socket.create_connection(("127.0.0.1", upstream))
    for s in (client, broker):
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, broker
def start():
    listen = socket.create_server(("127.0.0.1", int(sys.argv[1])))
    trio.run(main, listen, int(sys.argv[2]))
"""

FLOOR_RELAY = (
    _FLOOR_CONNECT
    + """
async def pump(source, sink):
    while True:
        await trio.lowlevel.wait_readable(source)
        data = os.read(source.fileno(), 262144)
        if not data:
            return
        os.write(sink.fileno(), data)
async def main(listen, upstream):
    client, broker = connect(listen, upstream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, client, broker)
        nursery.start_soon(pump, broker, client)
start()
"""
)

# The same carried by Sluice's relay thread (sluice/proxy/relay_thread.py):
# each socket stays registered, and a read step runs on the thread.
FLOOR_THREAD = (
    _FLOOR_CONNECT
    + """
from sluice.proxy.relay_thread import relay_thread
def step(source, sink, end):
    data = os.read(source, 262144)
    if not data:
        end()
        return
    os.write(sink, data)
async def main(listen, upstream):
    client, broker = connect(listen, upstream)
    c, b = client.fileno(), broker.fileno()
    ended = trio.Event()
    async with relay_thread() as thread:
        def end():
            thread.drop(c)
            thread.drop(b)
            thread.soon(ended.set)
        thread.carry(c, functools.partial(step, c, b, end))
        thread.carry(b, functools.partial(step, b, c, end))
        await ended.wait()
start()
"""
)


def _connect(port: int, process: subprocess.Popen[bytes]) -> socket.socket:
    """The first connection to ``port`` once it listens (the relay serves one)."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port))
        except ConnectionRefusedError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the minimal relay under valgrind did not start") from None
            time.sleep(0.2)


def floor(tmp: Path, rounds: int, program: str = FLOOR_RELAY) -> int:
    """Instructions of a minimal relay's whole life, ``rounds`` round trips."""
    out = tmp / f"callgrind-floor-{time.monotonic_ns()}.out"
    broker = socket.create_server(("127.0.0.1", 0))
    port = free_port()
    relay = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
         "-c", program, str(port), str(broker.getsockname()[1])],
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parent.parent,  # the sluice package of this tree
    )  # fmt: skip
    try:
        with _connect(port, relay) as client:
            upstream, _ = broker.accept()
            body = b"x" * 1024
            for _ in range(rounds):
                for sender, receiver in ((client, upstream), (upstream, client)):
                    sender.sendall(body)
                    got = 0
                    while got < len(body):
                        got += len(receiver.recv(65536))
            upstream.close()
        relay.wait(timeout=START_TIMEOUT)
    finally:
        relay.kill()
        broker.close()
    found = SUMMARY.search(out.read_bytes())
    if found is None:
        raise SystemExit(f"{out}: no callgrind summary line")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="also count the proxy from the sluice package in DIR")  # fmt: skip
    parser.add_argument("--messages", metavar="N1,N2",
                        help="the two message counts (default 2000,6000; "
                             "100,300 for --only along)")  # fmt: skip
    parser.add_argument("--only", choices=("produce", "consume", "along", "floor"),
                        help="one step only")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="the paced window of --only along (default 20)")  # fmt: skip
    parser.add_argument("--no-record", action="store_true", help="the proxy does not record")
    parser.add_argument(
        "--syscalls",
        action="store_true",
        help="count kernel calls per message of --only along instead (strace)",
    )
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep valgrind's files in DIR, for callgrind_annotate")  # fmt: skip
    args = parser.parse_args()
    if args.syscalls and args.only not in (None, "along"):
        parser.error("--syscalls counts --only along's calls")
    if args.syscalls:
        args.only = "along"
    if args.messages is None:
        if args.syscalls:
            args.messages = "1000,3000"
        else:
            args.messages = "100,300" if args.only == "along" else "2000,6000"
    try:
        low, high = (int(n) for n in args.messages.split(","))
    except ValueError:
        parser.error(f"--messages {args.messages!r}: two whole numbers, e.g. 2000,6000")
    if not 0 < low < high:
        parser.error(f"--messages {args.messages}: need 0 < N1 < N2")
    if args.syscalls and shutil.which("strace") is None:
        parser.error("strace is not installed (apt-get install strace, or ./dev bench)")
    if not args.syscalls and shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind, or ./dev bench)")
    if args.only == "floor":
        with tempfile.TemporaryDirectory() as tmp:
            counts = [floor(Path(tmp), rounds) for rounds in (low, high)]
            carried = [floor(Path(tmp), rounds, FLOOR_THREAD) for rounds in (low, high)]
        per = (counts[1] - counts[0]) / (2 * (high - low))
        per_carried = (carried[1] - carried[0]) / (2 * (high - low))
        print(f"floor: a minimal relay (os.read, os.write), 1 KiB, instructions per "
              f"crossing from {low:,} and {high:,} round trips")  # fmt: skip
        print(f"trio (wait_readable)  {per:>10,.0f}")
        print(f"relay thread          {per_carried:>10,.0f}")
        return 0
    here = Path(__file__).resolve().parent.parent
    sources = {"proxy": here}
    if args.against is not None:
        against = args.against.resolve()
        problem = source_error(against, "--against")
        if problem is not None:
            parser.error(problem)
        sources["against"] = against
    if args.syscalls:
        return syscalls_main(args, sources, low, high)
    steps = [args.only] if args.only else ["produce", "consume"]
    record = not args.no_record
    found: dict[tuple[str, str], float] = {}
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    with (
        (
            contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory()
        ) as tmp,
        EmbeddedBroker() as broker,
    ):
        for step in steps:
            for name, source in sources.items():
                counts = []
                for messages in (low, high):
                    started = time.monotonic()
                    counts.append(
                        count(broker, Path(tmp), source, step, messages, record, args.seconds)
                    )
                    print(f"{name} {step} {messages:,} messages: {counts[-1]:,} instructions "
                          f"({time.monotonic() - started:.0f} s)", file=sys.stderr)  # fmt: skip
                found[(name, step)] = (counts[1] - counts[0]) / (high - low)
    print(f"proxy: sluice from {describe_source(here)}")
    if args.against is not None:
        print(f"against: sluice from {describe_source(sources['against'])}")
    paced = f", paced over {args.seconds:g} s with a consumer along" if args.only == "along" else ""
    print(f"recording: {'on (payloads hashed)' if record else 'off'}; 1 KiB unbatched messages"
          f"{paced}, instructions per message from {low:,} and {high:,}")  # fmt: skip
    for step in steps:
        line = f"{step:<8} {found[('proxy', step)]:>10,.0f}"
        if args.against is not None:
            other = found[("against", step)]
            line += f"   against {other:>10,.0f}   change {found[('proxy', step)] / other - 1:+.1%}"
        print(line)
    return 0


if __name__ == "__main__":
    bench.run(main)
