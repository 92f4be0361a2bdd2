"""What the reliability tests and bench/soak.py share: a broker that can be
killed and restarted on the same address and data directory, a proxy with
an admin endpoint, process figures (RSS, open files) and metrics."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar
from prometheus_client.parser import text_string_to_metric_families

from sluice.brokers.embedded import EmbeddedBroker, free_port
from tests.helpers.poll import wait_until as wait_until  # its importers here keep it
from tests.helpers.support import QUIET, SLUICE, ProxyProcess, http_get, start_proxy

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class AdminProxy:
    """A ``sluice proxy`` process with its admin endpoint."""

    proxy: ProxyProcess
    admin: int

    @property
    def url(self) -> str:
        return self.proxy.url

    @property
    def pid(self) -> int:
        return self.proxy.pid

    def scrape(self) -> Samples:
        status, text = http_get(f"http://127.0.0.1:{self.admin}/metrics")
        assert status == 200, text
        out: Samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return sum(
            value for (n, lab), value in self.scrape().items() if n == name and want <= set(lab)
        )

    def kill(self) -> None:
        self.proxy.kill()


def start_admin_proxy(broker_url: str, tmp_path: Path, *extra: str) -> AdminProxy:
    admin = free_port()
    proxy = start_proxy(broker_url, tmp_path, "--admin", f"127.0.0.1:{admin}", *extra)
    return AdminProxy(proxy, admin)


class RestartableBroker:
    """A pulsar-lite broker on a fixed port and data directory, to be killed
    (SIGKILL) and started again in the same place."""

    def __init__(self, data_dir: Path, **options: Any) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.options = options
        self.current: EmbeddedBroker | None = None

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def start(self) -> RestartableBroker:
        assert self.current is None
        self.current = EmbeddedBroker(port=self.port, data_dir=self.data_dir, **self.options)
        self.current.start()
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would."""
        broker, self.current = self.current, None
        if broker is not None and broker.process is not None:
            broker.process.send_signal(signal.SIGKILL)
            broker.process.wait()
            broker.process = None

    def stop(self) -> None:
        broker, self.current = self.current, None
        if broker is not None:
            broker.stop()  # the directory is ours: stop() leaves it


@contextlib.contextmanager
def pulsar_client(url: str, *, cut: bool = False, **options: Any) -> Iterator[pulsar.Client]:
    """A client closed on the way out. ``cut``: the test kills the far end
    on purpose, so ``close()`` may find a producer's connection gone and say
    NotConnected (about 1 close in 15 after a SIGKILL); that is not a failure."""
    options.setdefault("operation_timeout_seconds", 30)
    c = pulsar.Client(url, logger=QUIET, **options)
    try:
        yield c
    finally:
        try:
            c.close()
        except pulsar.NotConnected:
            if not cut:
                raise


def body(tag: str, i: int, size: int = 1024) -> bytes:
    """A message of ``size`` bytes that says which one it is."""
    head = f"{tag}:{i:08d}:".encode()
    return head + b"x" * (size - len(head))


@dataclass
class Produced:
    """What a producer was told: receipts and failures, by message content."""

    acked: list[bytes] = field(default_factory=list)
    failed: list[tuple[bytes, str]] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def callback(self, content: bytes) -> Callable[[Any, Any], None]:
        def on_result(result: Any, _msg_id: Any) -> None:
            with self.lock:
                if result == pulsar.Result.Ok:
                    self.acked.append(content)
                    self.ack_times.append(time.monotonic())
                else:
                    self.failed.append((content, str(result)))
            self.done.release()

        return on_result


def read_all(
    url: str, topic: str, want: set[bytes], timeout: float, attempts: int = 3
) -> set[bytes]:
    """Every distinct message of ``topic`` from the start, until ``want`` is
    covered or nothing new arrives for ``timeout`` seconds (deduplicated by
    content: pulsar-lite may deliver an entry twice).

    pulsar-lite 0.2.0 sometimes stops dispatching to a subscription under
    load (measured direct, no proxy in the path): a read that stalls short
    of ``want`` is tried again on a fresh subscription, ``attempts`` times
    in all, before the shortfall is reported."""
    seen: set[bytes] = set()
    with pulsar_client(url) as c:
        for _ in range(attempts):
            consumer = c.subscribe(
                topic,
                f"check-{time.monotonic_ns()}",
                initial_position=pulsar.InitialPosition.Earliest,
            )
            while not want <= seen:
                try:
                    msg = consumer.receive(timeout_millis=int(timeout * 1000))
                except pulsar.Timeout:
                    break
                consumer.acknowledge(msg)
                seen.add(msg.data())
            consumer.close()
            if want <= seen:
                break
    return seen


def describe_missing(missing: set[bytes]) -> str:
    """A short account of missing messages made by ``body``: how many, which."""
    names = sorted(m.split(b":x", 1)[0].decode(errors="replace") for m in missing)
    shown = ", ".join(names[:5]) + (f" ... {names[-1]}" if len(names) > 5 else "")
    return f"{len(names)} ({shown})"


def run_sluice(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SLUICE, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
