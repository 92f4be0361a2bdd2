"""Apache Pulsar itself, standalone, on loopback ports: the real broker.

The release is pinned in ``apache-pulsar/pom.xml`` (beside this file) by Maven
coordinates. :func:`provision` asks Maven to resolve it (the broker with its
standalone starter, ``pulsar-perf``, the Apache Pulsar Proxy and the admin tool
``pulsar-admin``, which :meth:`Runtime.admin_tool` runs) into a local
repository under ``~/.cache/sluice/pulsar-<version>/`` and keeps the classpath
it printed; a second call finds the classpath and its jars and downloads
nothing. :class:`ApachePulsar` starts one standalone broker (metadata in
RocksDB, one bookie, no functions worker) with our own ``standalone.conf`` and
log configuration, waits until the broker's health check passes and a producer
round trip (through our own codec) works, and stops it by PID.

Used by the test suite, the benchmarks and ``sluice demo --embedded apache-pulsar``.
Needs Java 17 and Maven (``./dev setup`` installs both when missing).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from sluice.brokers.embedded import (
    _DRAWS,
    BrokerError,
    die_with,
    free_port,
    os_error,
    settings_written,
    terminate,
    wait_for_port,
)
from sluice.config import cache_dir
from sluice.protocols.pulsar import (
    CLOSED,
    Frame,
    FrameDecoder,
    Type,
    command,
    encode,
    encode_payload,
    pb,
)

RESOURCES = Path(__file__).with_name("apache-pulsar")
POM = RESOURCES / "pom.xml"
STANDALONE_MAIN = "org.apache.pulsar.PulsarStandaloneStarter"
PERF_MAIN = "org.apache.pulsar.testclient.PulsarPerfTestTool"
PROXY_MAIN = "org.apache.pulsar.proxy.server.ProxyServiceStarter"
ADMIN_MAIN = "org.apache.pulsar.admin.cli.PulsarAdminTool"
TOKEN_AUTH_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
# A short-lived JVM: the first compiler tier and one GC thread start it
# sooner (seconds, on a busy machine), and logs below WARN are not wanted.
ADMIN_JVM = (
    "-Xmx256m",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-Djava.net.preferIPv4Stack=true",
)

# Java 17 keeps these packages closed; the broker reads JVM and container
# figures through them and logs a stack trace at start without them.
JAVA_OPENS = [
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens=java.base/sun.net=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.platform=ALL-UNNAMED",
    "--add-opens=java.management/sun.management=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
]

Say = Callable[[str], None]
Setting = str | int | bool


class ProvisionError(BrokerError):
    """Apache Pulsar could not be fetched: no Java, no Maven, or Maven failed."""


def say_on_stderr(text: str) -> None:
    print(f"[apache-pulsar] {text}", file=sys.stderr, flush=True)


def pulsar_version() -> str:
    """The pinned release, as the pom states it (stated once, there)."""
    match = re.search(r"<pulsar\.version>([^<]+)</pulsar\.version>", POM.read_text())
    if match is None:
        raise ProvisionError(f"{POM} names no <pulsar.version>")
    return match.group(1).strip()


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ProvisionError("Apache Pulsar needs Java 17 or newer: ./dev setup installs it")
    return found


@dataclass(frozen=True)
class Runtime:
    """A provisioned release: its version and the jars of its classpath."""

    version: str
    home: Path
    classpath: tuple[str, ...]

    def java(self, main: str, *args: str, jvm: tuple[str, ...] = ()) -> list[str]:
        """The command line that runs ``main`` of this release."""
        return [java_binary(), *jvm, *JAVA_OPENS, "-cp", os.pathsep.join(self.classpath),
                main, *args]  # fmt: skip

    def perf(self, *args: str) -> list[str]:
        """``pulsar-perf ARGS``: the Java client's load tool. Its first argument
        is a client configuration file; ours is empty (flags say everything).
        Its latency histograms take a few hundred MiB of heap at start."""
        return self.java(PERF_MAIN, os.devnull, *args, jvm=("-Xmx1g",))

    def admin_tool(
        self,
        admin_url: str,
        *args: str,
        token: str | None = None,
        timeout: float = 120.0,
    ) -> AdminRun:
        """``pulsar-admin --admin-url ADMIN_URL ARGS``, the Java admin tool,
        run to its end: its exit status and output. ``token``: it presents
        that token (``AuthenticationToken``). Its client configuration file,
        its first argument, is empty (flags say everything). Past ``timeout``
        seconds it is killed and :class:`BrokerError` says what it printed;
        each of its requests times out at half that, so that a request left
        unanswered is the tool's own error rather than a kill."""
        options = ["--admin-url", admin_url, "--request-timeout", str(max(1, int(timeout / 2)))]
        if token is not None:
            options += ["--auth-plugin", TOKEN_AUTH_PLUGIN, "--auth-params", f"token:{token}"]
        command = self.java(ADMIN_MAIN, os.devnull, *options, *args, jvm=ADMIN_JVM)
        try:
            run = subprocess.run(
                command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            printed = b"".join(
                part if isinstance(part, bytes) else part.encode()
                for part in (exc.stdout, exc.stderr)
                if part
            )
            raise BrokerError(
                f"pulsar-admin {' '.join(args)} ran past {timeout:.0f} s and was killed; "
                f"it printed:\n{printed.decode(errors='replace')[-2000:]}"
            ) from None
        return AdminRun(tuple(args), run.returncode, run.stdout, run.stderr)


@dataclass(frozen=True)
class AdminRun:
    """One finished run of the Java admin tool."""

    args: tuple[str, ...]
    status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.status == 0

    def json(self) -> object:
        """Its output read as JSON (``--output json`` answers, stats, policies)."""
        return json.loads(self.stdout)

    def __str__(self) -> str:
        return (
            f"pulsar-admin {' '.join(self.args)}: exit {self.status}\n"
            f"{self.stdout[-2000:]}{self.stderr[-2000:]}"
        )


def provision(say: Say = say_on_stderr) -> Runtime:
    """The pinned release, fetched with Maven the first time, found after."""
    version = pulsar_version()
    home = cache_dir() / f"pulsar-{version}"
    listing = home / "classpath.txt"
    stamp = home / "pom.sha256"
    want = hashlib.sha256(POM.read_bytes()).hexdigest()
    try:
        if listing.is_file() and stamp.is_file() and stamp.read_text().strip() == want:
            jars = tuple(p for p in listing.read_text().strip().split(os.pathsep) if p)
            if jars and all(Path(j).is_file() for j in jars):
                return Runtime(version, home, jars)
    except (OSError, UnicodeDecodeError):
        pass  # a listing or stamp that cannot be read (damaged): fetched again
    java_binary()
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ProvisionError("fetching Apache Pulsar needs Maven (mvn): ./dev setup installs it")
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProvisionError(
            f"cannot keep Apache Pulsar in {home}: {exc.strerror or exc} "
            "(SLUICE_CACHE_DIR or XDG_CACHE_HOME moves the cache)"
        ) from None
    say(f"fetching Apache Pulsar {version} with Maven into {home} (about 240 MB, once)")
    started = time.monotonic()
    partial = home / "classpath.txt.partial"
    command = [
        mvn, "-B", "-ntp", "-q", "-f", str(POM),
        f"-Dmaven.repo.local={home / 'm2'}",
        "dependency:build-classpath",
        f"-Dmdep.outputFile={partial}",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if run.returncode != 0:
        lines = (run.stdout + run.stderr).strip().splitlines()
        errors = [line for line in lines if "ERROR" in line][:3] or lines[-10:]
        raise ProvisionError(
            f"Maven could not fetch Apache Pulsar {version} (exit {run.returncode}):\n"
            + "\n".join(errors)
        )
    partial.replace(listing)
    stamp.write_text(want + "\n")
    jars = tuple(p for p in listing.read_text().strip().split(os.pathsep) if p)
    size = sum(Path(j).stat().st_size for j in jars) / 2**20
    say(f"Apache Pulsar {version}: {len(jars)} jars, {size:.0f} MiB, "
        f"fetched in {time.monotonic() - started:.1f} s")  # fmt: skip
    return Runtime(version, home, jars)


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for the broker's TLS ports: its chain, its key, the CA it trusts."""

    cert: Path
    key: Path
    ca: Path


def hs256_token(secret: bytes, subject: str, expires_at: float | None = None) -> str:
    """A JWT signed HS256, as Pulsar's token provider reads it with ``tokenSecretKey``."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    claims: dict[str, object] = {"sub": subject}
    if expires_at is not None:
        claims["exp"] = int(expires_at)
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims).encode())
    signature = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(signature)}"


def write_conf(template: str, values: Mapping[str, Setting], path: Path) -> Path:
    """``template`` (a file beside this module) with ``values`` set, each key
    once: the bookie reads standalone.conf too, with a parser that turns a
    repeated key into a list and then uses its first value."""

    def line(key: str, value: Setting) -> str:
        return f"{key}={str(value).lower() if isinstance(value, bool) else value}"

    left = dict(values)
    lines = []
    for text in RESOURCES.joinpath(template).read_text().splitlines():
        key = text.split("=", 1)[0].strip()
        if "=" in text and not text.lstrip().startswith("#") and key in left:
            text = line(key, left.pop(key))
        lines.append(text)
    lines.append("# Written for this process by sluice/brokers/apache_pulsar.py")
    lines += [line(key, value) for key, value in left.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def jvm_flags(heap_mb: int, direct_mb: int) -> tuple[str, ...]:
    return (
        f"-Xms{min(256, heap_mb)}m",
        f"-Xmx{heap_mb}m",
        f"-XX:MaxDirectMemorySize={direct_mb}m",
        "-XX:+UseG1GC",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.net.preferIPv4Stack=true",
        f"-Dlog4j2.configurationFile={RESOURCES / 'log4j2.properties'}",
        # Netty's leak detector is not wanted in tests and benchmarks.
        "-Dio.netty.leakDetectionLevel=disabled",
    )


class JavaServer:
    """A JVM process of the pinned release, logging to a file, stopped by PID."""

    data_dir: Path
    _own_dir: bool
    # The process is sent SIGTERM by the kernel when the thread that started
    # it ends (Linux), should this process die without stopping it (SIGKILL):
    # for a command's broker (``sluice demo``), as EmbeddedBroker's.
    die_with_parent: bool = False

    def __init__(self, log_path: Path, say: Say, what: str) -> None:
        self.log_path = log_path
        self.say = say
        self.what = what
        self.runtime: Runtime | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds: float | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def version(self) -> str:
        return self.runtime.version if self.runtime else pulsar_version()

    def start(self) -> Self:
        raise NotImplementedError

    def _launch(self, command: list[str], cwd: Path) -> subprocess.Popen[bytes]:
        try:
            log = open(self.log_path, "ab")  # noqa: SIM115 - closed below, the child's copy kept
        except OSError as exc:
            raise os_error(f"open the {self.what}'s log", self.log_path, exc) from None
        with log:
            try:
                self.process = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=cwd,
                    preexec_fn=die_with(os.getpid()) if self.die_with_parent else None,
                )
            except OSError as exc:  # java not executable, a data dir it cannot enter
                raise os_error(f"run the {self.what}", command[0], exc) from None
        return self.process

    def _check_alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            code = self.process.returncode if self.process else None
            raise BrokerError(f"{self.what} exited with status {code}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL, as a crash would; the data stays for a ``start()`` again."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a broker closes its topics and ledgers), then SIGKILL."""
        process, self.process = self.process, None
        if process is not None:
            terminate(process, timeout)

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ApachePulsar(JavaServer):
    """One Apache Pulsar standalone broker process.

    ``with ApachePulsar() as broker: broker.url`` provisions the release when
    needed, starts the broker on free loopback ports with a scratch data
    directory, and on exit stops it and removes the directory. ``kill()`` and
    ``start()`` again restart it on the same ports and data.

    ``settings`` are broker settings (``standalone.conf`` keys) on top of ours;
    ``tls`` opens the TLS ports too; ``admin_token`` is the superuser token the
    readiness checks and :meth:`admin` use when authentication is on;
    ``die_with_parent``: the JVM goes when this process is killed outright
    (SIGKILL), for a command's broker (``sluice demo``).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        data_dir: str | Path | None = None,
        *,
        settings: Mapping[str, Setting] | None = None,
        tls: TlsFiles | None = None,
        admin_token: str | None = None,
        heap_mb: int = 768,
        direct_mb: int = 1024,
        start_timeout: float = 180.0,
        log_path: str | Path | None = None,
        say: Say = say_on_stderr,
        die_with_parent: bool = False,
    ) -> None:
        self.host = host
        self.die_with_parent = die_with_parent
        self.port = free_port(host)
        self.web_port = free_port(host)
        self.tls = tls
        self.tls_port = free_port(host) if tls else None
        self.web_tls_port = free_port(host) if tls else None
        self._own_dir = data_dir is None
        try:
            self.data_dir = (
                Path(data_dir)
                if data_dir
                else Path(tempfile.mkdtemp(prefix="sluice-apache-pulsar-"))
            )
        except OSError as exc:  # (no usable temporary directory: the error names none)
            raise os_error("create the broker's data directory", "in $TMPDIR", exc) from None
        self.settings = dict(settings or {})
        self.admin_token = admin_token
        self.heap_mb = heap_mb
        self.direct_mb = direct_mb
        self.start_timeout = start_timeout
        super().__init__(
            Path(log_path) if log_path else self.data_dir / "broker.log", say, "broker"
        )

    # -- addresses ---------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"pulsar://{self.host}:{self.port}"

    @property
    def tls_url(self) -> str:
        if self.tls_port is None:
            raise BrokerError("this broker has no TLS port (start it with tls=...)")
        return f"pulsar+ssl://{self.host}:{self.tls_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.web_port}"

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    # -- configuration -----------------------------------------------------------

    def _config(self) -> Path:
        values: dict[str, Setting] = {
            "brokerServicePort": self.port,
            "webServicePort": self.web_port,
        }
        if self.tls is not None:
            values |= {
                "brokerServicePortTls": self.tls_port or 0,
                "webServicePortTls": self.web_tls_port or 0,
                "tlsCertificateFilePath": str(self.tls.cert),
                "tlsKeyFilePath": str(self.tls.key),
                "tlsTrustCertsFilePath": str(self.tls.ca),
            }
        values |= self.settings
        if "maxMessageSize" in self.settings and "nettyMaxFrameSizeBytes" not in self.settings:
            values["nettyMaxFrameSizeBytes"] = int(self.settings["maxMessageSize"]) + 10 * 1024

        return write_conf("standalone.conf", values, self.data_dir / "standalone.conf")

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> ApachePulsar:
        if self.process is not None:
            raise BrokerError("broker already started")
        self.runtime = provision(self.say)
        for draws in range(_DRAWS, 0, -1):
            try:
                return self._start()
            except BrokerError:
                # A port drawn free at construction was bound by another
                # process before the JVM (seconds later) could: those drawn
                # again, on a first start only (a start after kill() is on
                # the same ports, by design).
                taken = [p for p in self._ports() if _held(self.host, p)]
                if self.start_seconds is not None or draws == 1 or not taken:
                    raise
                # Settings that name a port (advertisedListeners) would go
                # on naming the old one: the caller makes a broker anew.
                if any(str(p) in str(value) for p in taken for value in self.settings.values()):
                    raise
                self.say(f"port(s) {', '.join(map(str, taken))} taken meanwhile: new ones")
                self._redraw(taken)
        raise AssertionError("unreachable")

    def _ports(self) -> list[int]:
        return [p for p in (self.port, self.web_port, self.tls_port, self.web_tls_port) if p]

    def _redraw(self, taken: list[int]) -> None:
        if self.port in taken:
            self.port = free_port(self.host)
        if self.web_port in taken:
            self.web_port = free_port(self.host)
        if self.tls_port in taken:
            self.tls_port = free_port(self.host)
        if self.web_tls_port in taken:
            self.web_tls_port = free_port(self.host)

    def _start(self) -> ApachePulsar:
        assert self.runtime is not None
        config = settings_written(self.data_dir, self._config)
        command = self.runtime.java(
            STANDALONE_MAIN,
            "--config", str(config),
            "--no-functions-worker",
            "--no-stream-storage",
            jvm=jvm_flags(self.heap_mb, self.direct_mb),
        )  # fmt: skip
        started = time.monotonic()
        # The standalone keeps its bookie and metadata under ./data.
        process = self._launch(command, cwd=self.data_dir)
        try:
            deadline = started + self.start_timeout
            wait_for_port(self.host, self.port, self.start_timeout, process)
            self._wait_healthy(deadline)
            self._round_trip(deadline)
        except BrokerError as exc:
            self.stop()
            tail = self.log_tail()
            raise BrokerError(f"Apache Pulsar did not start: {exc}\n{tail}") from None
        except BaseException:  # Ctrl-C while it comes up, say: not left running
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        self.say(
            f"Apache Pulsar {self.version} ready on {self.url} (HTTP {self.http_url}) "
            f"in {self.start_seconds:.1f} s, pid {self.pid}"
        )
        return self

    def _wait_healthy(self, deadline: float) -> None:
        """The broker's own health check: it writes and reads a heartbeat topic."""
        last = ""
        while True:
            self._check_alive()
            try:
                status, body = self.admin("GET", "/admin/v2/brokers/health", timeout=10)
                if status == 200:
                    return
                last = f"HTTP {status} {body[:200]}"
            except OSError as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise BrokerError(f"health check did not pass in time (last: {last})")
            time.sleep(0.5)

    def _round_trip(self, deadline: float) -> None:
        """A producer's first send acknowledged, spoken through our own codec.

        Not through the official client: the C++ client keeps the largest
        message size it last heard in a CONNECTED for the whole process, so a
        readiness check against a broker with a raised ``maxMessageSize``
        would change how the caller's later clients chunk for other brokers.
        """
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with socket.create_connection(self.address, timeout=10) as sock:
                    self._produce_once(sock)
                return
            except (OSError, BrokerError) as exc:
                last = str(exc)
                time.sleep(0.5)
        raise BrokerError(f"no producer round trip in time (last: {last})")

    def _produce_once(self, sock: socket.socket) -> None:
        decoder = FrameDecoder()

        def ask(data: bytes, answer: str) -> Frame:
            return exchange(sock, decoder, data, answer)

        hello = pb.CommandConnect(client_version="sluice-readiness", protocol_version=21)
        if self.admin_token:
            hello.auth_method_name, hello.auth_data = "token", self.admin_token.encode()
        topic = "persistent://public/default/sluice-readiness"
        ask(encode(command(Type.Value("CONNECT"), hello)), "CONNECTED")
        lookup = pb.CommandLookupTopic(topic=topic, request_id=1)
        ask(encode(command(Type.Value("LOOKUP"), lookup)), "LOOKUP_RESPONSE")
        producer = pb.CommandProducer(topic=topic, producer_id=1, request_id=2)
        name = ask(encode(command(Type.Value("PRODUCER"), producer)), "PRODUCER_SUCCESS")
        meta = pb.MessageMetadata(
            producer_name=name.body.producer_name,
            sequence_id=0,
            publish_time=int(time.time() * 1000),
        )
        send = pb.CommandSend(producer_id=1, sequence_id=0)
        ask(encode_payload(command(Type.Value("SEND"), send), meta, b"ready"), "SEND_RECEIPT")

    def admin(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        timeout: float = 30,
        base: str | None = None,
    ) -> tuple[int, str]:
        """One call of the broker's admin REST API: (status, body text);
        ``base``: another web service in front of it (a proxy's)."""
        data = None if body is None else json.dumps(body).encode()
        url = (base or self.http_url) + path
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.admin_token:
            request.add_header("Authorization", f"Bearer {self.admin_token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, answer.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")

    def admin_json(self, method: str, path: str, body: object = None) -> object:
        """An admin call that must succeed; its JSON answer (None when empty)."""
        status, text = self.admin(method, path, body)
        if status >= 300:
            raise BrokerError(f"{method} {path}: HTTP {status} {text[:500]}")
        return json.loads(text) if text.strip() else None


class ApachePulsarProxy(JavaServer):
    """The Apache Pulsar Proxy of the same release, in front of ``broker``.

    Our own ``proxy.conf`` (beside this module) points it at the broker's
    binary and HTTP URLs; it listens on a free loopback port. Ready once a
    CONNECT through it is answered; ``start_seconds`` is the time from the
    process's start to that first answered connection.
    """

    def __init__(
        self,
        broker: ApachePulsar,
        *,
        settings: Mapping[str, Setting] | None = None,
        heap_mb: int = 512,
        direct_mb: int = 512,
        start_timeout: float = 120.0,
        log_path: str | Path | None = None,
        say: Say = say_on_stderr,
    ) -> None:
        self.broker = broker
        self.host = broker.host
        self.port = free_port(self.host)
        self.web_port = free_port(self.host)
        self._own_dir = True
        try:
            self.data_dir = Path(tempfile.mkdtemp(prefix="sluice-apache-pulsar-proxy-"))
        except OSError as exc:
            raise os_error("create the proxy's data directory", "in $TMPDIR", exc) from None
        self.settings = dict(settings or {})
        self.heap_mb = heap_mb
        self.direct_mb = direct_mb
        self.start_timeout = start_timeout
        super().__init__(Path(log_path) if log_path else self.data_dir / "proxy.log", say, "proxy")

    @property
    def url(self) -> str:
        return f"pulsar://{self.host}:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def start(self) -> ApachePulsarProxy:
        if self.process is not None:
            raise BrokerError("proxy already started")
        self.runtime = provision(self.say)
        values: dict[str, Setting] = {
            "brokerServiceURL": self.broker.url,
            "brokerWebServiceURL": self.broker.http_url,
            "servicePort": self.port,
            "webServicePort": self.web_port,
            # Its allow-list for the brokers clients name (6650 and 6651 by
            # default): the broker's own port, as Sluice allows it.
            "brokerProxyAllowedTargetPorts": self.broker.port,
        }
        values |= self.settings
        config = write_conf("proxy.conf", values, self.data_dir / "proxy.conf")
        command = self.runtime.java(
            PROXY_MAIN, "--config", str(config), jvm=jvm_flags(self.heap_mb, self.direct_mb)
        )
        started = time.monotonic()
        process = self._launch(command, cwd=self.data_dir)
        try:
            wait_for_port(self.host, self.port, self.start_timeout, process)
            answered_connect(self.address, started + self.start_timeout, self._check_alive)
        except BrokerError as exc:
            self.stop()
            raise BrokerError(
                f"Apache Pulsar Proxy did not start: {exc}\n{self.log_tail()}"
            ) from None
        except BaseException:  # Ctrl-C while it comes up, say: not left running
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        self.say(
            f"Apache Pulsar Proxy {self.version} ready on {self.url} "
            f"in {self.start_seconds:.1f} s, pid {self.pid}"
        )
        return self


def _held(host: str, port: int) -> bool:
    """Whether another socket is bound to ``port`` on ``host`` now. Bound as
    a server binds (SO_REUSEADDR), so that the broker's own connections left
    in TIME_WAIT (its health checks, after a start that timed out) are not
    taken for another process's port and the start tried again for them."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def answered_connect(
    address: tuple[str, int], deadline: float, alive: Callable[[], None] = lambda: None
) -> None:
    """Wait until a CONNECT to ``address`` gets CONNECTED (our own codec)."""
    last = ""
    while time.monotonic() < deadline:
        alive()
        try:
            with socket.create_connection(address, timeout=5) as sock:
                hello = pb.CommandConnect(client_version="sluice-readiness", protocol_version=21)
                exchange(sock, FrameDecoder(), encode(command(Type.Value("CONNECT"), hello)),
                         "CONNECTED")  # fmt: skip
                return
        except (OSError, BrokerError) as exc:
            last = str(exc)
            time.sleep(0.05)
    raise BrokerError(f"no CONNECTED from {address[0]}:{address[1]} in time (last: {last})")


def exchange(sock: socket.socket, decoder: FrameDecoder, data: bytes, answer: str) -> Frame:
    """Send ``data``; the next frame, which must be ``answer`` (PINGs answered)."""
    sock.sendall(data)
    while True:
        event = decoder.next_event()
        if isinstance(event, Frame):
            if event.name == answer:
                return event
            if event.name == "PING":
                sock.sendall(encode(command(Type.Value("PONG"))))
                continue
            raise BrokerError(f"{event.name} instead of {answer}: {event.body}")
        if event is CLOSED:
            raise BrokerError(f"connection closed while waiting for {answer}")
        decoder.receive_data(sock.recv(65536))


def main(argv: list[str] | None = None) -> int:
    """``python -m sluice.brokers.apache_pulsar provision|run``."""
    parser = argparse.ArgumentParser(
        prog="python -m sluice.brokers.apache_pulsar",
        description="Fetch (provision) or start (run) Sluice's pinned Apache Pulsar.",
    )
    parser.add_argument("action", choices=["provision", "run"])
    args = parser.parse_args(argv)
    try:
        runtime = provision()
        if args.action == "provision":
            say_on_stderr(f"Apache Pulsar {runtime.version} is ready in {runtime.home}")
            return 0
        # SIGTERM as Ctrl-C from here on, while the JVM comes up too: the
        # broker stopped and its data removed. die_with_parent: a SIGKILL
        # of this process takes the JVM with it.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        with ApachePulsar(die_with_parent=True) as broker:
            say_on_stderr(f"{broker.url} until Ctrl-C (log: {broker.log_path})")
            while True:
                time.sleep(3600)
    except BrokerError as exc:
        print(f"apache-pulsar: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
