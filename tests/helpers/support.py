"""Helpers for tests that run the real proxy, client and broker."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.server
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import pulsar
import trustme

from sluice.brokers import Broker
from sluice.brokers.embedded import EmbeddedBroker, free_port, wait_for_port
from sluice.protocols.pulsar import (
    CLOSED,
    NEED_DATA,
    Frame,
    FrameDecoder,
    Type,
    command,
    encode,
    encode_payload,
    pb,
)

SLUICE = [sys.executable, "-m", "sluice"]


def redelivers(broker: Broker) -> bool:
    """pulsar-lite 0.2.0 dispatches some entries twice on its own (no proxy in
    the path); Apache Pulsar does not, so there a second copy is a failure."""
    from sluice.brokers.embedded import EmbeddedBroker

    return isinstance(broker, EmbeddedBroker)


def stores_corrupt_sends(broker: Broker) -> bool:
    """pulsar-lite stores a SEND whose checksum is wrong and acknowledges it;
    Apache Pulsar answers SEND_ERROR ChecksumError (measured on 4.0.8)."""
    from sluice.brokers.embedded import EmbeddedBroker

    return isinstance(broker, EmbeddedBroker)


QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


@dataclass
class ProxyProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    tls_port: int | None = None

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_proxy(
    broker_url: str,
    tmp_path: Path,
    *extra: str,
    port: int | None = None,
    tls_port: int | None = None,
    wait: bool = True,
    preexec: Callable[[], None] | None = None,
    source: Path | None = None,
    env: dict[str, str] | None = None,
) -> ProxyProcess:
    """``sluice proxy`` on a free loopback port; ``source``: a directory
    whose sluice package to run instead of this checkout's; ``env``: more
    of its environment."""
    port = port or free_port()
    log_path = tmp_path / f"proxy-{port}-{time.monotonic_ns()}.log"
    args = [*SLUICE, "proxy", "--listen", f"127.0.0.1:{port}", "--broker", broker_url, *extra]
    if tls_port is not None:
        args += ["--listen-tls", f"127.0.0.1:{tls_port}"]
    where = run_from(source) if source is not None else {}
    if env:
        where["env"] = {**where.get("env", os.environ), **env}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec, **where
        )
    proxy = ProxyProcess(process, port, log_path, tls_port)
    if wait:
        try:
            wait_for_port("127.0.0.1", port, 20, process)
        except Exception:
            proxy.kill()
            raise AssertionError(f"proxy did not start:\n{proxy.log()}") from None
    return proxy


def recorded_session(tmp: Path, session: Callable[[str], object]) -> Path:
    """``session(url)`` run through a recording proxy (payloads kept) in
    front of a broker of its own; the recording's directory."""
    with EmbeddedBroker() as broker:
        p = start_proxy(broker.url, tmp, "--record", str(tmp / "rec"), "--record-payloads", "full")
        try:
            session(p.url)
            assert p.terminate() == 0
        finally:
            p.kill()
    return tmp / "rec"


def source_error(source: Path, flag: str) -> str | None:
    """Why ``source`` (given with ``flag``) holds no sluice package to run
    with ``run_from``; None when it does."""
    if (source / "sluice" / "commands" / "__init__.py").is_file():
        return None
    return f"{flag} {source}: no sluice/commands/__init__.py there"


def run_from(source: Path) -> dict[str, Any]:
    """Popen options that make ``python -m sluice`` run the sluice
    package in ``source`` (e.g. a worktree of an older commit): ``-m`` puts
    the working directory first on sys.path, ahead of the installed one."""
    path = os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")]))
    return {"cwd": source, "env": {**os.environ, "PYTHONPATH": path}}


def describe_source(source: Path) -> str:
    """The directory, with its git commit when it is a checkout, and whether
    its Python or Rust sources differ from that commit."""

    def git(*args: str) -> str:
        run = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True,
                             timeout=10)  # fmt: skip
        return run.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "sluice", "rust")
    except (OSError, subprocess.SubprocessError):
        return str(source)
    if not commit:
        return str(source)
    return f"{source} at {commit}" + (" + uncommitted changes" if dirty else "")


def in_child(function: Callable[..., Any], *args: Any, timeout: float = 180) -> Any:
    """``function(*args)`` in a fresh interpreter: its result, or its exception.

    For clients that must not share the test process's C++ client. That
    client keeps the largest message size it last heard in a CONNECTED for
    the whole process: once it has met a broker that names one (Apache
    Pulsar: 5 MiB, or whatever its maxMessageSize says), it sizes chunks for
    every later broker by it. pulsar-lite names none and closes the
    connection on any frame over 5 MiB, headers included, and the client's
    send then retries forever, past its send timeout.
    """
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
        return pool.submit(function, *args).result(timeout)


@contextlib.contextmanager
def client(url: str, **options: Any) -> Iterator[pulsar.Client]:
    c = pulsar.Client(url, **{"operation_timeout_seconds": 15, "logger": QUIET, **options})
    try:
        yield c
    finally:
        c.close()


def tcp_connections(pid: int) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """(local, remote) of every IPv4 TCP socket process ``pid`` has open."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = []
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[9] in inodes:
            out.append((_addr(fields[1]), _addr(fields[2])))
    return out


def holds_a_client(pid: int, port: int) -> bool:
    """Whether process ``pid`` serves a connection accepted on ``port``."""
    return any(local[1] == port and remote[1] for local, remote in tcp_connections(pid))


def worker_pids(proxy: ProxyProcess, count: int, timeout: float = 30) -> dict[int, int]:
    """Worker index -> pid, from the supervisor's log."""
    deadline = time.monotonic() + timeout
    while True:
        found = {int(i): int(p) for i, p in re.findall(r"worker (\d+) \(pid (\d+)\) ready",
                                                       proxy.log())}  # fmt: skip
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@contextlib.contextmanager
def stopped(pids: list[int], timeout: float = 10) -> Iterator[None]:
    """Processes ``pids`` stopped (SIGSTOP) for the block, continued after."""
    sent: list[int] = []
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            sent.append(pid)
        for pid in pids:
            wait_stopped(pid, timeout)
        yield
    finally:
        for pid in sent:
            os.kill(pid, signal.SIGCONT)


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether process ``pid`` has exited (and been reaped) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def wait_stopped(pid: int, timeout: float = 10) -> None:
    """Wait until process ``pid``, sent SIGSTOP, is stopped (``all_stopped``)."""
    deadline = time.monotonic() + timeout
    while not all_stopped(pid):
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.01)


def all_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped: a SIGSTOP takes
    effect a moment after kill() returns, thread by thread, and a process
    still running then may yet answer what the test meant it to miss."""
    tasks = Path(f"/proc/{pid}/task")
    states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
    return all(state in ("T", "t") for state in states)


def one_client_per_worker(pids: dict[int, int], connect: Callable[[], Any]) -> list[Any]:
    """One client from ``connect()`` (which must leave its connections open)
    on each worker in ``pids``, in their order.

    The workers share one listening socket, and which waiting worker the
    kernel wakes is its choice: on some machines the same one wins every
    time. So all other workers are stopped while a worker's client
    connects, which leaves every accept to that one."""
    made = []
    for pid in pids.values():
        with stopped([other for other in pids.values() if other != pid]):
            made.append(connect())
    return made


def _addr(text: str) -> tuple[str, int]:
    ip_hex, port_hex = text.split(":")
    ip = socket.inet_ntoa(bytes.fromhex(ip_hex)[::-1])
    return ip, int(port_hex, 16)


class RawClient:
    """A hand-driven Pulsar connection, for frames the real client never sends."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.decoder = FrameDecoder()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self, timeout: float = 10.0) -> Frame | None:
        """The next frame, or None once the peer closed."""
        deadline = time.monotonic() + timeout
        while True:
            event = self.decoder.next_event()
            if isinstance(event, Frame):
                return event
            if event is CLOSED:
                return None
            assert event is NEED_DATA
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame in time")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            self.decoder.receive_data(data)

    def receive_type(self, name: str, timeout: float = 10.0) -> Frame:
        """Skip PINGs and the like until a frame of type ``name``."""
        while True:
            frame = self.receive(timeout)
            assert frame is not None, f"connection closed while waiting for {name}"
            if frame.name == name:
                return frame
            if frame.name == "PING":
                self.send(encode(command(Type.Value("PONG"))))

    def send_connect(
        self, proxy_to_broker_url: str | None = None, token: bytes | None = None
    ) -> None:
        """Send a CONNECT (with a token, ``auth_method_name="token"``); read nothing."""
        body = pb.CommandConnect(client_version="sluice-tests", protocol_version=21)
        if proxy_to_broker_url is not None:
            body.proxy_to_broker_url = proxy_to_broker_url
        if token is not None:
            body.auth_method_name = "token"
            body.auth_data = token
        self.send(encode(command(Type.Value("CONNECT"), body)))

    def connect(self, proxy_to_broker_url: str | None = None) -> Frame:
        self.send_connect(proxy_to_broker_url)
        frame = self.receive()
        assert frame is not None, "connection closed during CONNECT"
        return frame

    def producer(self, broker_port: int, topic: str, producer_id: int = 1) -> str:
        """Relay this connection to the broker and create a producer; its name."""
        assert self.connect(f"127.0.0.1:{broker_port}").name == "CONNECTED"
        self.lookup(topic, request_id=1000 + producer_id)
        body = pb.CommandProducer(topic=topic, producer_id=producer_id, request_id=1)
        self.send(encode(command(Type.Value("PRODUCER"), body)))
        name: str = self.receive_type("PRODUCER_SUCCESS").body.producer_name
        return name

    def lookup(self, topic: str, request_id: int) -> Frame:
        """LOOKUP on this connection, as a client does before a PRODUCER:
        Apache Pulsar serves a topic only once a lookup has made it own the
        topic's namespace bundle ("not served by this instance" otherwise)."""
        body = pb.CommandLookupTopic(topic=topic, request_id=request_id)
        self.send(encode(command(Type.Value("LOOKUP"), body)))
        return self.receive_type("LOOKUP_RESPONSE")

    def send_message(
        self,
        name: str,
        producer_id: int,
        sequence_id: int,
        payload: bytes,
        *,
        corrupt: bool = False,
    ) -> None:
        """A checksummed SEND; ``corrupt`` flips the last payload bit after checksumming."""
        meta = pb.MessageMetadata(producer_name=name, sequence_id=sequence_id, publish_time=1)
        send = pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id)
        frame = bytearray(encode_payload(command(Type.Value("SEND"), send), meta, payload))
        if corrupt:
            frame[-1] ^= 0x01
        self.send(bytes(frame))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class PrometheusProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as error:
            raise AssertionError(f"prometheus refused {params}: {error.read().decode()}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[Any]:
        data = self.api("/api/v1/query", query=expr)
        result: list[Any] = data["result"]
        return result

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_prometheus(
    tmp_path: Path, targets: list[str], rule_files: list[Path]
) -> PrometheusProcess:
    """Debian's prometheus scraping ``targets`` every second."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed (./dev setup installs it)"
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(p) for p in rule_files],
                "scrape_configs": [
                    {"job_name": "sluice", "static_configs": [{"targets": targets}]}
                ],
            }
        )
    )
    log_path = tmp_path / "prometheus.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    prom = PrometheusProcess(process, port, log_path)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as answer:
                if answer.status == 200:
                    return prom
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            prom.kill()
            raise AssertionError(f"prometheus did not start:\n{log_path.read_text()[-2000:]}")
        time.sleep(0.2)


def http_get(url: str, method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_ready(admin: int, timeout: float = 30) -> None:
    """Until the proxy's ``/readyz`` on loopback port ``admin`` says 200."""
    deadline = time.monotonic() + timeout
    while (answer := http_get(f"http://127.0.0.1:{admin}/readyz"))[0] != 200:
        assert time.monotonic() < deadline, f"never ready: {answer}"
        time.sleep(0.05)


def tls_files(tmp_path: Path, *names: str) -> tuple[Path, Path, trustme.CA]:
    """A CA file and a server cert+key file for ``names``."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.issue_cert(*names).private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "srv.pem"))
    return tmp_path / "ca.pem", tmp_path / "srv.pem", ca


@contextlib.contextmanager
def https_server(
    tmp_path: Path, handler: type[http.server.BaseHTTPRequestHandler]
) -> Iterator[tuple[http.server.ThreadingHTTPServer, Path]]:
    """The stdlib's HTTP server on a loopback port, over TLS with a
    certificate for ``localhost``: (the server, the CA file to trust it
    with). Shut down on exit."""
    ca, cert, _ = tls_files(tmp_path, "localhost")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    side.load_cert_chain(cert)
    server.socket = side.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server, ca
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def https_answers(
    tmp_path: Path, answer: Callable[[str, str], bytes | None]
) -> Iterator[tuple[str, Path]]:
    """An HTTPS server (``https_server``) that answers each GET with what
    ``answer(base, path)`` gives, ``base`` being ``https://`` and the host
    the request named: 200 with those bytes, or 404 for None. Yields (its
    base URL on ``localhost``, the CA file to trust it with)."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answer(f"https://{self.headers['Host']}", self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    with https_server(tmp_path, Answer) as (server, ca):
        yield f"https://localhost:{server.server_address[1]}", ca


def common_name(conn: ssl.SSLSocket) -> str:
    """The common name of the certificate the peer of ``conn`` presented
    ("" for none)."""
    cert = conn.getpeercert() or {}
    names = [tuple(n) for rdn in cert.get("subject", ()) for n in rdn]
    return next((str(n[1]) for n in names if n[0] == "commonName"), "")


class ClientCertListener:
    """A TLS listener on loopback, with a certificate of ``ca`` for
    ``host``, that requires a client certificate of ``ca``. Each connection
    it accepts goes to ``_one`` (a subclass's), in a thread of its own, its
    handshake not yet made; ``seen``, for the subclass to keep the common
    name each came with in. Closed when its ``with`` block ends."""

    def __init__(self, ca: trustme.CA, host: str) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(host).configure_cert(self.context)
        ca.configure_trust(self.context)
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(raw,), daemon=True).start()

    def _one(self, raw: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def kill_with_workers(proxy: ProxyProcess, pids: dict[int, int]) -> None:
    """SIGKILL a ``--workers`` proxy and its workers (``worker_pids``), by PID."""
    proxy.kill()
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
