"""TLS settings, dialling (the one place Sluice opens a connection to a
broker) and listening (the one place it binds a port).

TLS is 1.2 at least, both ways. A TLS listener's certificate and key are
re-read when they change on disk (``CertificateReloader``), as cert-manager
rotates them in a Kubernetes pod: new handshakes get the new certificate,
open connections keep going.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import ipaddress
import logging
import os
import socket
import ssl
import sys
import tempfile
import termios
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from sluice.addresses import Address
from sluice.errors import ConfigError

log = logging.getLogger("sluice.tls")

# How often a TLS listener's certificate files are checked for changes.
RELOAD_INTERVAL = 10.0
MINIMUM_TLS = ssl.TLSVersion.TLSv1_2


@dataclass(frozen=True)
class TlsServerConfig:
    cert: Path
    key: Path
    # When set, clients must present a certificate signed by this CA.
    client_ca: Path | None = None


@dataclass(frozen=True)
class TlsClientConfig:
    """How Sluice verifies brokers it dials over TLS."""

    ca: Path | None = None  # None: the system trust store
    verify_hostname: bool = True
    # Client certificate for brokers that require one.
    cert: Path | None = None
    key: Path | None = None


# Where to listen: an address family and the socket address to bind.
ListenTarget = tuple[socket.AddressFamily, tuple[Any, ...]]


def listen_targets(address: Address) -> list[ListenTarget]:
    """Every IPv4 and IPv6 address ``address.host`` resolves to (an empty
    host: every interface, both families). Raises OSError."""
    infos = socket.getaddrinfo(address.host or None, address.port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)  # fmt: skip
    targets: list[ListenTarget] = []
    for family, _, _, _, sockaddr in infos:
        target = (family, tuple(sockaddr))  # the whole address: a v6 scope id too
        if family in (socket.AF_INET, socket.AF_INET6) and target not in targets:
            targets.append(target)
    if not targets:
        raise OSError(f"{address.host} resolves to no IPv4 or IPv6 address")
    return targets


def _listening(
    family: socket.AddressFamily, sockaddr: tuple[Any, ...], backlog: int, v6only: bool = True
) -> socket.socket:
    """One listening socket (errors as the OS gives them: socket.create_server
    adds its own words to strerror, which our one-line messages print).
    ``v6only``: an IPv6 socket takes IPv6 clients only (else IPv4 ones too,
    as IPv4-mapped addresses)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
        sock.bind(sockaddr)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def bind_all(
    address: Address, backlog: int = 4096, targets: list[ListenTarget] | None = None
) -> list[socket.socket]:
    """Listening sockets on every address ``address.host`` resolves to
    (``targets``, when already resolved), all on one port.

    The host as written is what clients are told to dial, and a name like
    ``localhost`` may resolve to ::1 and 127.0.0.1: with port 0 each would
    get a port of its own, and a client trying the other family would be
    refused. So the rest take the port the first one got. Raises OSError
    (a port in use, a name that does not resolve).

    Each family has a socket of its own, as listed, except for the IPv6
    wildcard alone (``[::]:PORT``): it takes IPv4 clients too (dual stack,
    as IPv6-only and dual-stack Kubernetes pods are reached), unless an
    IPv4 address is bound on the same port as well.
    """
    targets = list(targets if targets is not None else listen_targets(address))
    for _ in range(3):
        sockets: list[socket.socket] = []
        port = address.port
        try:
            v4 = any(family == socket.AF_INET for family, _ in targets)
            for family, sockaddr in list(targets):
                dual = family == socket.AF_INET6 and sockaddr[0] == "::" and not v4
                try:
                    sock = _listening(
                        family, (sockaddr[0], port, *sockaddr[2:]), backlog, v6only=not dual
                    )
                except OSError as exc:
                    # A family this kernel has no support for (IPv6 compiled
                    # out, say): the others serve, as trio's listeners do.
                    if exc.errno == errno.EAFNOSUPPORT and len(targets) > 1:
                        targets.remove((family, sockaddr))
                        continue
                    raise
                sockets.append(sock)
                port = sock.getsockname()[1]
            return sockets
        except OSError as exc:
            for sock in sockets:
                sock.close()
            # Port 0 whose first port was taken on another family: draw
            # again. Anything else is the real error.
            if address.port or not sockets or exc.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"no port free on every address of {address.host}")


async def open_listeners(address: Address) -> list[trio.SocketListener]:
    """``bind_all`` as trio listeners (resolving off the event loop)."""
    sockets = await trio.to_thread.run_sync(bind_all, address)
    return [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets]


class EncryptedKey(Exception):
    """A key file that asks for a password (which Sluice has no option for)."""


def _no_password() -> bytes:
    """The password callback of every key Sluice loads. Without one,
    OpenSSL asks for an encrypted key's password on the terminal,
    blocking the process (the event loop, when a listener's certificate is
    reloaded) until someone types it; with none there, it failed with
    "Invalid argument", which named nothing."""
    raise EncryptedKey("the key is encrypted (password-protected); give it unencrypted")


def load_pair(context: ssl.SSLContext, cert: Path | str, key: Path | str | None) -> None:
    """``context.load_cert_chain``, never asking for a password (``EncryptedKey``)."""
    context.load_cert_chain(str(cert), str(key) if key is not None else None,
                            password=_no_password)  # fmt: skip


def server_ssl_context(config: TlsServerConfig) -> ssl.SSLContext:
    """A TLS listener's context. Files that do not load are a ``ConfigError``
    naming them (the ssl module's own message is "[SSL] PEM lib")."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = MINIMUM_TLS
    try:
        load_pair(context, config.cert, config.key)
    except (OSError, ssl.SSLError, EncryptedKey) as exc:
        raise ConfigError(
            f"cannot load the TLS certificate {config.cert} with the key {config.key}: "
            f"{_reason(exc)}"
        ) from None
    if config.client_ca is not None:
        try:
            context.load_verify_locations(str(config.client_ca))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load the client CA {config.client_ca}: {_reason(exc)}"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _reason(exc: OSError | EncryptedKey) -> str:
    """Why a PEM file did not load, in words ("no certificate or key in it")."""
    if isinstance(exc, EncryptedKey):
        return str(exc)
    if isinstance(exc, ssl.SSLError):
        if exc.reason:  # "KEY_VALUES_MISMATCH"
            return str(exc.reason).replace("_", " ").lower()
        if "PEM lib" in str(exc):  # OpenSSL gives no reason for these
            return "not a PEM certificate and key"
    return exc.strerror or str(exc)


class CertificateReloader:
    """Loads a listener's certificate and key into its context again when
    either file changes (modification time, size or inode: a Kubernetes
    secret update swaps a symlink). A pair that does not load (say, the key
    written a moment after the certificate) is logged once and retried at
    the next change; the old certificate stays in use meanwhile."""

    def __init__(self, config: TlsServerConfig, context: ssl.SSLContext) -> None:
        self.config = config
        self.context = context
        self.reloads = 0
        self._stamp: tuple[tuple[int, int, int], ...] | None = self._now()

    def _now(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            stats = [os.stat(path) for path in (self.config.cert, self.config.key)]
        except OSError:
            return None  # mid-rotation: look again later
        return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in stats)

    def check(self) -> bool:
        """Reload if the files changed; whether a new certificate is in use."""
        stamp = self._now()
        if stamp is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        # One snapshot of both files, tried on a scratch context first: a
        # pair that fails half-way would leave the live context with a
        # certificate and a key that do not match.
        try:
            pems = [path.read_bytes() for path in (self.config.cert, self.config.key)]
        except OSError:
            self._stamp = None  # mid-rotation: look again at the next tick
            return False
        with tempfile.TemporaryDirectory(prefix="sluice-tls-") as scratch:
            cert, key = Path(scratch) / "cert.pem", Path(scratch) / "key.pem"
            for path, pem in ((cert, pems[0]), (key, pems[1])):
                path.touch(mode=0o600)
                path.write_bytes(pem)
            try:
                trial = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                load_pair(trial, cert, key)
            except (OSError, ssl.SSLError, EncryptedKey) as exc:
                log.error("TLS certificate %s with the key %s changed but does not load "
                          "(keeping the old pair): %s", self.config.cert, self.config.key,
                          _reason(exc))  # fmt: skip
                return False
            load_pair(self.context, cert, key)
        self.reloads += 1
        log.info("TLS certificate %s reloaded", self.config.cert)
        return True

    async def run(self, interval: float = RELOAD_INTERVAL) -> None:
        while True:
            await trio.sleep(interval)
            self.check()


def client_ssl_context(config: TlsClientConfig) -> ssl.SSLContext:
    """A context for dialling brokers over TLS. Files that do not load are
    a ``ConfigError`` naming them, as ``server_ssl_context``'s."""
    try:
        context = ssl.create_default_context(cafile=str(config.ca) if config.ca else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the broker CA {config.ca}: {_reason(exc)}") from None
    context.minimum_version = MINIMUM_TLS
    # Without hostname checks the certificate is still checked against the
    # CA (as Pulsar's tlsHostnameVerificationEnable=false leaves it): only
    # the name it was issued for may differ from the address dialled.
    context.check_hostname = config.verify_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    if not config.verify_hostname:
        _said_no_hostname_check()
    if config.cert is not None:
        try:
            load_pair(context, config.cert, config.key)
        except (OSError, ssl.SSLError, EncryptedKey) as exc:
            raise ConfigError(
                f"cannot load the client certificate {config.cert}: {_reason(exc)}"
            ) from None
    return context


@functools.cache
def _said_no_hostname_check() -> None:
    """Said once a process, when a context that checks no host name is made."""
    log.warning("--broker-tls-no-verify-hostname: brokers' certificates are not checked "
                "against the host dialled; any certificate the CA signed is taken for any "
                "broker, so whoever holds one can stand in for every broker")  # fmt: skip


async def dial(
    address: Address,
    *,
    timeout: float,
    tls: ssl.SSLContext | None = None,
    preamble: bytes = b"",
) -> trio.abc.Stream:
    """Open a TCP (optionally TLS) connection, all within ``timeout`` seconds;
    ``preamble`` (a PROXY protocol header) goes first, before TLS.

    Raises ``OSError`` with a readable message on failure or timeout.
    """
    stream: trio.abc.Stream
    with trio.move_on_after(timeout) as scope:
        tcp = await open_tcp(address)
        try:
            if preamble:
                try:
                    await tcp.send_all(preamble)
                except trio.BrokenResourceError as exc:
                    raise OSError(
                        f"{address} closed the connection: {exc.__cause__ or exc}"
                    ) from exc
            if tls is None:
                return tcp
            stream = trio.SSLStream(tcp, tls, server_hostname=address.host,
                                    https_compatible=False)  # fmt: skip
            try:
                await stream.do_handshake()
            except trio.BrokenResourceError as exc:
                raise OSError(
                    f"TLS handshake with {address} failed: {exc.__cause__ or exc}"
                ) from exc
            return stream
        except BaseException:  # failed, timed out or cancelled: closed now, not when collected
            tcp.socket.close()
            raise
    assert scope.cancelled_caught
    raise _timed_out(address, timeout)


async def finish_dial(fd: int, address: Address, timeout: float) -> trio.SocketStream:
    """``dial`` for a plain TCP connection ``start_tcp`` began (its descriptor)."""
    with trio.move_on_after(timeout):
        return socket_stream(await finish_tcp(fd, address))
    raise _timed_out(address, timeout)


def _timed_out(address: Address, timeout: float) -> OSError:
    return OSError(f"connecting to {address} timed out after {timeout:g}s")


async def open_tcp(address: Address) -> trio.SocketStream:
    """A TCP connection to ``address``. An IP address is connected to
    directly; a name goes through trio's ``open_tcp_stream`` (lookup, then
    happy eyeballs). For a single address, that machinery (a nursery, a
    task, a lookup and their cancel scopes) was a fifth of what a
    short-lived proxied connection cost in all."""
    started = start_tcp(address)
    if started is None:
        try:
            return await trio.open_tcp_stream(address.host, address.port)
        except UnicodeError as exc:  # a name IDNA cannot encode: an empty or a long label
            raise OSError(f"{address.host}: not a name that can be looked up ({exc})") from None
    fd, connected = started
    if not connected:
        return socket_stream(await finish_tcp(fd, address))
    return socket_stream(_tcp_socket(fd, address))


def socket_stream(sock: socket.socket | int) -> trio.SocketStream:
    """A trio stream for a connected TCP socket, or for its descriptor
    (which the stream then owns: a connection parked on the relay thread
    has only descriptors until trio takes it over)."""
    if isinstance(sock, int):
        sock = socket.socket(fileno=sock)
    return trio.SocketStream(trio.socket.from_stdlib_socket(sock))


# Where the platform has it: a socket made non-blocking (one system call less).
_NONBLOCK: int = getattr(socket, "SOCK_NONBLOCK", 0)

try:  # the same, without a Python socket object (rust/src/sockets.rs)
    from sluice._frames import connect_now as _connect_now
except ImportError:  # a source tree nobody built
    _connect_now = None  # type: ignore[assignment]


def start_tcp(address: Address) -> tuple[int, bool] | None:
    """Begin a TCP connection to an IP address without waiting: the
    socket's descriptor (non-blocking, with trio's TCP_NODELAY: a
    connection that stays on the relay thread never becomes a trio stream)
    and whether it is connected already; None for a name (which needs a
    lookup). Raises ``OSError`` where the connection fails at once (over
    loopback, a port nobody listens on)."""
    if _connect_now is not None:
        started: tuple[int, bool] | None = _connect_now(address.host, address.port)
        if started is not None:
            return started
    family = _ip_family(address.host)
    if family is None:
        return None
    target = (address.host, address.port)
    sock = socket.socket(family, socket.SOCK_STREAM | _NONBLOCK)
    try:
        if not _NONBLOCK:
            sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        error = sock.connect_ex(target)
        # A connection over loopback (a sidecar's) is made before connect()
        # returns, though it says "in progress": seen at once, that saves
        # waiting for the socket to be writable. (Connected, it has no
        # error to fetch: one that comes later comes with a read or write.)
        connected = True
        if error == errno.EINPROGRESS:
            connected = _connected(sock)
        elif error:
            raise OSError(error, f"Error connecting to {target!r}: {os.strerror(error)}")
    except BaseException:
        sock.close()
        raise
    return sock.detach(), connected


async def finish_tcp(fd: int, address: Address) -> socket.socket:
    """Wait for a connection ``start_tcp`` began (its descriptor) to be
    made: its socket. Closes it if it fails (raising ``OSError``), or if
    the wait is cancelled."""
    sock = _tcp_socket(fd, address)
    try:
        await trio.lowlevel.wait_writable(sock)
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            target = (address.host, address.port)
            raise OSError(error, f"Error connecting to {target!r}: {os.strerror(error)}")
    except BaseException:
        trio.lowlevel.notify_closing(sock)
        sock.close()
        raise
    return sock


def _tcp_socket(fd: int, address: Address) -> socket.socket:
    """The socket object for the descriptor ``start_tcp`` gave for
    ``address``, told its family, type and protocol (else Python asks the
    kernel for each)."""
    family = _ip_family(address.host)
    assert family is not None  # (start_tcp dials IP addresses only)
    return socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=fd)


def _connected(sock: socket.socket) -> bool:
    """Whether a socket whose connect() is in progress is connected already."""
    try:
        sock.getpeername()
    except OSError:
        return False
    return True


@functools.lru_cache(maxsize=256)
def _ip_family(host: str) -> int | None:
    """AF_INET or AF_INET6 for an IP address; None for a name."""
    try:
        version = ipaddress.ip_address(host).version
    except ValueError:
        return None
    return socket.AF_INET6 if version == 6 else socket.AF_INET


async def close_stream(stream: trio.abc.AsyncResource) -> None:
    """Close ``stream`` now, gracefully or not, whatever state it is in;
    never raises, and is not cut short by a cancellation (so a ``finally``
    of a cancelled task may call it as it is). A plain TCP stream is closed
    where it stands: trio's ``aclose_forcefully`` would pass through the
    scheduler twice and raise and catch a ``Cancelled`` to do the same, and
    a shielding scope around it would cost more than the close."""
    if type(stream) is trio.SocketStream:
        stream.socket.close()
        return
    with (
        trio.CancelScope(shield=True),
        contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError),
    ):
        await trio.aclose_forcefully(stream)


# How long a connection Sluice hangs up on is given to take in the last
# frames written to it, and how much of what it sends meanwhile is read
# and dropped (``hang_up``).
LINGER = 1.0
LINGER_BYTES = 1 << 20
# How long a peer that has everything Sluice wrote must stay silent for
# its socket to be closed before the peer hangs up itself.
QUIET = 0.02


def stream_descriptor(stream: trio.abc.Stream) -> int | None:
    """The TCP socket's descriptor under ``stream`` (plain or TLS); None
    for anything else, or a socket closed already."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if isinstance(stream, trio.SocketStream):
        fd = stream.socket.fileno()
        return fd if fd != -1 else None
    return None


def shut_write(fd: int) -> None:
    """Send the peer a FIN after what was written to ``fd`` (nothing if
    the socket is no longer connected)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        sock.detach()


def discard(fd: int, budget: int = LINGER_BYTES) -> int | None:
    """Read and drop what the peer sent that is there now (``fd`` is
    non-blocking), up to ``budget`` bytes: what is left of the budget, or
    None when there is nothing more to wait for (the peer hung up, the
    socket failed, or the budget is spent).

    A TCP socket closed with bytes it has not read sends a reset instead
    of a FIN, and the peer's kernel throws away what it has not yet handed
    to its application, the last frames written to it included."""
    while budget > 0:
        try:
            data = os.read(fd, min(budget, 64 * 1024))
        except BlockingIOError:
            return budget
        except OSError:
            return None
        if not data:
            return None
        budget -= len(data)
    return None


def unsent(fd: int) -> int | None:
    """Bytes written to the TCP socket ``fd`` that its peer has not
    acknowledged yet (Linux's SIOCOUTQ); None where that cannot be told."""
    try:
        got = fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return None
    return int.from_bytes(got, sys.byteorder, signed=True)


async def hang_up(streams: list[trio.abc.Stream], until: float) -> None:
    """Close ``streams`` so that the last frames written to them reach
    their peers, as proxies hang up: a FIN goes after the data
    (``shut_write``), then what each peer still sends is read and dropped
    (``discard``: closing at once would reset a connection whose peer is
    still sending, and the peer would lose what had not reached it). A
    socket is closed when its peer hangs up too, or when its peer has
    acknowledged everything written to it and has sent nothing for
    ``QUIET`` seconds (a reset from then on loses nothing of ours), or at
    ``until`` (trio's clock), or after ``LINGER_BYTES``. Bounded: a peer
    that never stops is cut at ``until``, and a cancellation closes every
    stream at once. Never raises anything but ``trio.Cancelled``; a stream
    with no TCP socket under it is just closed."""
    try:
        waiting: list[tuple[int, int]] = []
        for stream in streams:
            fd = stream_descriptor(stream)
            if fd is None:
                continue
            shut_write(fd)
            left = discard(fd)
            if left is not None:
                waiting.append((fd, left))
        with trio.move_on_at(until):
            for fd, left in waiting:  # one after the other: each waits for the same end
                budget: int | None = left
                while budget is not None:
                    with trio.move_on_after(QUIET) as quiet:
                        await trio.lowlevel.wait_readable(fd)
                    if not quiet.cancelled_caught:
                        budget = discard(fd, budget)
                    elif unsent(fd) == 0:
                        break
    finally:
        for stream in streams:
            # What a peer sent while another was waited for (or since its
            # own wait ended) is dropped too: closed with unread bytes, its
            # socket would reset, and the peer would lose what it had not
            # taken in yet of Sluice's last frames.
            fd = stream_descriptor(stream)
            if fd is not None:
                discard(fd)
            await close_stream(stream)


async def accepted(listener: trio.abc.Listener[Any], what: str) -> AsyncIterator[trio.abc.Stream]:
    """The connections ``listener`` accepts, until it is closed. A failed
    accept (out of file descriptors, say) is logged, naming ``what``
    listener, and tried again after a pause: the listener keeps serving."""
    while True:
        try:
            stream = await listener.accept()
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return
        except OSError as exc:
            logging.getLogger("sluice.proxy").error("accept failed on %s: %s", what, exc)
            await trio.sleep(0.1)
            continue
        yield stream


def certificate_cn(stream: trio.SSLStream[Any]) -> str | None:
    """The CN of the client's certificate, verified by the TLS handshake
    (``--tls-client-ca``); None without one. With several, the one a Pulsar
    broker takes: the first of the subject as RFC 2253 writes it, which is
    the last in the certificate."""
    try:
        certificate = stream.getpeercert()
    except (ValueError, AttributeError, ssl.SSLError):  # no handshake yet
        return None
    for rdn in reversed((certificate or {}).get("subject", ())):
        for key, value in rdn:
            if key == "commonName" and isinstance(value, str) and value:
                return value
    return None
