"""A SEND that Sluice refuses is answered after the receipts of the sends
before it, also for a producer whose SENDs the compiled step seals (the
``encrypt`` filter alone on its topic), with many sends in flight.

The official client (C++) fails the oldest send it waits for on a
SEND_ERROR: one that overtook the receipt of an earlier send is taken for
the wrong one, and the client drops the connection and sends them again
(or, as seen, crashes: so it runs in a process of its own here)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO

import pytest

from sluice.brokers.embedded import EmbeddedBroker, free_port
from tests.helpers.support import ProxyProcess, start_proxy
from tests.test_dashboards import scrape, value
from tests.test_encryption_e2e import make_key_pair

pytestmark = pytest.mark.e2e

MAX = 1024 * 1024  # the broker's message size limit, and Sluice's
IN_FLIGHT = 30
AFTER = 5

# The client: a producer, 20 sends one at a time (both directions go to the
# relay thread), "ready"; on "go", IN_FLIGHT small sends, one that is just
# under Sluice's frame limit as sent (encrypted, past it: Sluice refuses it,
# too_large, and sends none of it on), AFTER small ones, all at once; then
# each answer as it comes, a JSON line (index, result).
CLIENT = """
import json, logging, sys, pulsar
url, topic, in_flight, after, size = sys.argv[1:]
in_flight, after, size = int(in_flight), int(after), int(size)
logging.basicConfig(level=logging.WARNING)  # (on stderr: stdout is for the answers)
client = pulsar.Client(url, operation_timeout_seconds=10, logger=logging.getLogger("client"))
producer = client.create_producer(topic, batching_enabled=False)
for i in range(20):
    producer.send(b"warm %d" % i)
print("ready", flush=True)
sys.stdin.readline()
def answered(i):
    return lambda result, _: print(json.dumps([i, result.name]), flush=True)
for i in range(in_flight):
    producer.send_async(b"x" * 1000, answered(i))
producer.send_async(b"y" * (size - 64), answered(in_flight), properties={"p": "z" * 10190})
for i in range(after):
    producer.send_async(b"after %d" % i, answered(in_flight + 1 + i))
producer.flush()
sys.stdin.readline()
"""


def test_a_refused_send_of_a_compiled_sealed_producer_waits_for_earlier_receipts(
    tmp_path: Path,
) -> None:
    keys = make_key_pair(tmp_path, "k")
    spec = {"topics": ["persistent://public/default/h1-*"], "direction": "produce",
            "settings": {"public_keys": {"k": str(keys.public)}}}  # fmt: skip
    admin = free_port()
    topic = f"persistent://public/default/h1-{uuid.uuid4().hex[:8]}"
    with EmbeddedBroker(max_message_size=MAX) as broker:
        proxy = start_proxy(
            broker.url, tmp_path, "--filter", f"encrypt:{json.dumps(spec)}",
            "--max-message-size", str(MAX), "--admin", f"127.0.0.1:{admin}",
        )  # fmt: skip
        url = f"pulsar://127.0.0.1:{proxy.port}"
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT, url, topic, str(IN_FLIGHT), str(AFTER), str(MAX)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert client.stdin is not None and client.stdout is not None
        try:
            lines: queue.Queue[str] = queue.Queue()
            threading.Thread(target=_read_lines, args=(client.stdout, lines), daemon=True).start()
            assert lines.get(timeout=30) == "ready\n"
            # The broker answers nothing for a while: every send before the
            # refused one is still in flight when Sluice refuses it.
            assert broker.pid is not None
            os.kill(broker.pid, signal.SIGSTOP)
            try:
                client.stdin.write("go\n")
                client.stdin.flush()
                deadline = time.monotonic() + 20
                while not _rejected(proxy, admin) and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert _rejected(proxy, admin) == {"too_large": 1.0}
            finally:
                os.kill(broker.pid, signal.SIGCONT)
            answers: list[tuple[int, str]] = []
            deadline = time.monotonic() + 20
            while len(answers) < IN_FLIGHT + 1 + AFTER:
                try:
                    line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if not line:  # the client ended (it may crash)
                    break
                index, result = json.loads(line)
                answers.append((index, result))
            expected = [(i, "Ok") for i in range(IN_FLIGHT)] + [(IN_FLIGHT, "ChecksumError")]
            expected += [(IN_FLIGHT + 1 + i, "Ok") for i in range(AFTER)]
            assert answers == expected
            metrics = scrape(proxy, admin)
            assert _rejected(proxy, admin) == {"too_large": 1.0}
            # The compiled loop carried reads of this connection by itself.
            assert value(metrics, "sluice_relay_thread_reads_total", path="compiled") > 0
        finally:
            client.kill()
            client.wait()
            proxy.kill()
    assert "Traceback" not in proxy.log(), proxy.log()


def _rejected(proxy: ProxyProcess, admin: int) -> dict[str, float]:
    """sluice_filter_rejected_total by reason."""
    return {
        dict(labels)["reason"]: count
        for (name, labels), count in scrape(proxy, admin).items()
        if name == "sluice_filter_rejected_total"
    }


def _read_lines(stream: IO[str], lines: queue.Queue[str]) -> None:
    """Each line of ``stream`` into ``lines``, then "" at its end."""
    for line in stream:
        lines.put(line)
    lines.put("")
