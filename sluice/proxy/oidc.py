"""OpenID Connect's I/O, protocol-neutral: the issuers' keys and Sluice's own
OAuth2 token, fetched over HTTP(S) (Pulsar's proxy mode uses it).

What is fetched is judged by the sans-I/O halves in
``sluice/protocols/oidc.py`` (``OidcVerifier``, ``ClientCredentials``);
this module only fetches: the standard library's HTTP client (urllib, with
an ``ssl`` context of the system's CAs or ``--auth-oidc-ca``) in a worker
thread, bounded in time and size.

- ``Issuers`` fetches an issuer's discovery document and key set when a
  token needs them (a core's ``Ask``; one fetch per issuer at a time, the
  others wait for it, or for the next one) and again on schedule, so that keys the issuer
  rotates in are known before tokens signed with them arrive.
- ``keep_own_token`` fetches Sluice's own token and fetches it again
  before it expires, keeping the last good one while the issuer is away.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import logging
import math
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

import jwt
import trio

from sluice.errors import ConfigError
from sluice.logs import clipped
from sluice.protocols.oidc import (
    DISCOVERY_PATH,
    MAX_DOCUMENT,
    ClientCredentials,
    NoUsableKey,
    OidcVerifier,
    TokenRefused,
)

log = logging.getLogger("sluice.oidc")

# How often the schedule looks at the issuers' keys.
TICK = 30.0
# A failed fetch of Sluice's own token is tried again after this, doubled
# each time up to MAX_BACKOFF.
BACKOFF = 1.0
MAX_BACKOFF = 30.0
# Sluice's own token is fetched again at most this often, however short
# its life (an issuer saying 0.01 s is not asked a hundred times a second).
MIN_REFRESH = 1.0
# Fetches run in threads, at most this many at once (their own limiter:
# one an issuer holds up to its deadline never holds up trio's shared one).
FETCH_THREADS = 16
# URLs in a fetch's failure are shown up to this many characters, its
# reason (which may repeat the URL: InvalidURL) up to MAX_REASON.
MAX_URL = 200
MAX_REASON = 400


class FetchError(Exception):
    """Why a document could not be fetched (one line)."""


def client_context(ca: Path | None) -> ssl.SSLContext:
    """Trust for https issuers: the system's CAs, or ``ca``'s."""
    try:
        return ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--auth-oidc-ca {ca}: {exc}") from None


class _NoDowngrade(urllib.request.HTTPRedirectHandler):
    """Redirects followed as urllib does, except from https to http: keys and
    tokens fetched over https are not to come over plain HTTP instead."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if req.type == "https" and urllib.parse.urlsplit(newurl).scheme != "https":
            raise urllib.error.URLError(f"redirected to {clipped(newurl)}, not https")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


# The deadline of the fetch the current thread runs (``_fetch`` sets it):
# each blocking step of its HTTP exchange waits at most what is left of it.
_fetching = threading.local()


def _left() -> float:
    """Seconds left of this thread's fetch; TimeoutError when none."""
    left: float = _fetching.deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


class _BoundedReader(io.RawIOBase):
    """An answer read from ``sock``, each read waiting at most what is left
    of the fetch's deadline: an answer whose head (or body) trickles in a
    byte at a time is cut off at the deadline, not one read's timeout
    after each byte."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        # The socket's own reader: it keeps the socket open while the
        # answer is read (urllib closes the connection's hold on it).
        self._raw = sock.makefile("rb", buffering=0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(_left())
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _BoundedResponse(http.client.HTTPResponse):
    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp.close()
        self.fp = io.BufferedReader(_BoundedReader(sock))


class _Lookup:
    """One name resolution, in a thread of its own, that any fetch asking
    for the same name meanwhile waits for too."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.done = threading.Event()
        self.found: list[Any] = []
        self.error: OSError | None = None

    def run(self) -> None:
        try:
            self.found = socket.getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM)
        except OSError as exc:
            self.error = exc
        finally:
            with _LOOKUPS_LOCK:
                if _LOOKUPS.get((self.host, self.port)) is self:
                    del _LOOKUPS[(self.host, self.port)]
            self.done.set()


# The resolutions under way, by name: a fetch waits for its name at most
# what is left of its deadline, and the resolution (the system resolver's,
# which may take 5 s a try per name server) goes on in its own thread, not
# in the fetch's (the fetches' threads are FETCH_THREADS in all, for every
# issuer). One thread per name at a time: fetches of an issuer whose name
# server is away do not pile up threads.
_LOOKUPS: dict[tuple[str, int], _Lookup] = {}
_LOOKUPS_LOCK = threading.Lock()


def _resolve(host: str, port: int) -> list[Any]:
    """``getaddrinfo`` of ``host`` within what is left of the fetch."""
    with _LOOKUPS_LOCK:
        lookup = _LOOKUPS.get((host, port))
        if lookup is None:
            lookup = _Lookup(host, port)
            try:
                threading.Thread(target=lookup.run, name="sluice-oidc-resolve", daemon=True).start()
            except RuntimeError as exc:  # (no thread to be had: none left waited for)
                raise OSError(f"resolving {host}: {exc}") from None
            _LOOKUPS[(host, port)] = lookup
    if not lookup.done.wait(_left()):
        raise TimeoutError(f"resolving {host}: deadline passed")
    if lookup.error is not None:  # (shared: each waiter raises its own)
        raise type(lookup.error)(*lookup.error.args)
    return lookup.found


def _bounded_connect(
    address: tuple[str, int], timeout: object, source: tuple[str, int] | None = None
) -> socket.socket:
    """Resolve and connect within what is left of the fetch (each address
    the name has, in turn), and leave the TLS handshake that follows no
    more than what is left then."""
    error: OSError = OSError(f"{address[0]}: no address")
    for family, kind, proto, _, sockaddr in _resolve(*address):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(_left())
            if source is not None:
                sock.bind(source)
            sock.connect(sockaddr)
            sock.settimeout(_left())
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise error


class _BoundedHTTP(http.client.HTTPConnection):
    response_class = _BoundedResponse

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _bounded_connect

    def send(self, data: Any) -> None:
        if self.sock is not None:
            self.sock.settimeout(_left())
        super().send(data)


class _BoundedHTTPS(_BoundedHTTP, http.client.HTTPSConnection):
    """The same bounds over TLS (HTTPSConnection's own connect wraps the
    bounded socket; the handshake has what is left)."""


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_BoundedHTTP, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__(context=context)
        self._bounded_context = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_BoundedHTTPS, req, context=self._bounded_context)


def _fetch(url: str, body: bytes | None, context: ssl.SSLContext, timeout: float) -> bytes:
    """GET ``url`` (POST ``body`` as a form, when given); its body. The
    whole exchange (connecting, TLS, the answer's head and body, an error
    answer's body) ends within ``timeout``: its thread does not outlive it."""
    opener = urllib.request.build_opener(_HTTPHandler(), _HTTPSHandler(context), _NoDowngrade())
    deadline = _fetching.deadline = time.monotonic() + timeout
    # The URL may be the issuer's (a jwks_uri, a token endpoint): one line.
    shown = clipped(url, MAX_URL)
    try:
        # In the try: a URL urllib cannot take (ValueError) is a failed fetch.
        request = urllib.request.Request(url, data=body, headers={"Accept": "application/json"})
        if body is not None:
            request.add_header("Content-Type", "application/x-www-form-urlencoded")
        with opener.open(request, timeout=timeout) as answer:
            chunks: list[bytes] = []
            size = 0
            while size <= MAX_DOCUMENT:
                if time.monotonic() > deadline:
                    raise FetchError(f"{shown}: no answer within {timeout:g}s")
                chunk: bytes = answer.read1(64 * 1024)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
    except urllib.error.HTTPError as exc:
        detail = b""
        # An OAuth2 error says why; one not read (in time: TimeoutError is an
        # OSError) says nothing.
        with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
            detail = exc.read(MAX_DOCUMENT) if body is not None else b""
        raise FetchError(f"{shown}: HTTP {exc.code}{_oauth2_error(detail)}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        # HTTPException: InvalidURL (a space or control character in the
        # URL), an answer http.client cannot read (BadStatusLine, ...).
        if time.monotonic() >= deadline:
            raise FetchError(f"{shown}: no answer within {timeout:g}s") from None
        reason = str(getattr(exc, "reason", exc))
        if not reason.isprintable() or len(reason) > MAX_REASON:
            reason = clipped(reason, MAX_REASON)
        raise FetchError(f"{shown}: {reason}") from None
    if len(data) > MAX_DOCUMENT:
        raise FetchError(f"{shown}: over {MAX_DOCUMENT} bytes")
    return data


def _oauth2_error(detail: bytes) -> str:
    """An OAuth2 error answer's ``error`` and description, if it is one."""
    import json

    try:
        data = json.loads(detail)
    except ValueError:
        return ""
    if not isinstance(data, dict) or not isinstance(data.get("error"), str):
        return ""
    # The issuer's words, one line each (a line break would forge a log line).
    said = data.get("error_description")
    described = f": {clipped(said, 200)}" if isinstance(said, str) else ""
    return f" ({clipped(data['error'], 100)}{described})"


async def fetch(
    url: str, context: ssl.SSLContext, timeout: float, body: bytes | None = None
) -> bytes:
    """``_fetch`` in a worker thread, FetchError when it takes longer than
    ``timeout`` in all (connecting, TLS, the answer); the thread is then
    abandoned (not waited for: it ends at its own deadline, the same), as it
    is when cancelled. The threads are fetches' own
    (FETCH_THREADS at once), not of trio's limiter that the whole process
    shares."""
    with trio.move_on_after(timeout):
        return await trio.to_thread.run_sync(
            _fetch, url, body, context, timeout, abandon_on_cancel=True, limiter=_threads()
        )
    raise FetchError(f"{clipped(url, MAX_URL)}: no answer within {timeout:g}s")


_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("oidc_fetch_threads")


def _threads() -> trio.CapacityLimiter:
    """The fetches' thread limiter (one per trio run)."""
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(FETCH_THREADS)
        _LIMITER.set(limiter)
        return limiter


class Issuers:
    """Fetches the allowed issuers' keys into ``verifier``."""

    def __init__(self, verifier: OidcVerifier, context: ssl.SSLContext, timeout: float) -> None:
        self.verifier = verifier
        self.context = context
        self.timeout = timeout
        # Per issuer, the fetch under way: when it began, and its end.
        self._running: dict[str, tuple[float, trio.Event]] = {}
        # While ``run`` runs: where fetches run, so that one a client asked
        # for goes on when that client hangs up (it would have counted as
        # tried, its keys not taken in, for --auth-oidc-miss-refresh).
        self._nursery: trio.Nursery | None = None
        # Issuers whose key set held no usable key at the last fetch (warned of).
        self._empty: set[str] = set()

    async def fetch(self, issuer: str, join: bool = False) -> None:
        """Fetch ``issuer``'s keys, as they are from now on: a fetch under way
        that began after this call is waited for, one that began before it
        (it may miss a key the issuer made since) is waited out and then
        followed by another. Failures are logged and told to the verifier
        (which then refuses the tokens it cannot check, saying why). An
        issuer the verifier does not hold (a keys request made before a
        reload took it out) is not fetched: its tokens are refused.
        ``join``: the fetch under way, if any, is waited for and no other
        begun, none either when it has ended meanwhile (``KeysNeeded.join``:
        a token whose kid the held set lacks, while a fetch that may bring
        it runs; a new fetch is --auth-oidc-miss-refresh's to allow)."""
        if issuer not in self.verifier.issuers:
            return
        if join:
            if (running := self._running.get(issuer)) is not None:
                await running[1].wait()
            return
        wanted = trio.current_time()
        while (running := self._running.get(issuer)) is not None:
            began, done = running
            await done.wait()
            if began >= wanted:
                return
        done = trio.Event()
        self._running[issuer] = (trio.current_time(), done)
        if self._nursery is None:
            await self._fetch_then(issuer, done)
        else:
            self._nursery.start_soon(self._fetch_then, issuer, done)
            await done.wait()

    async def _fetch_then(self, issuer: str, done: trio.Event) -> None:
        try:
            await self._fetch(issuer)
        finally:
            del self._running[issuer]
            done.set()

    async def _fetch(self, issuer: str) -> None:
        verifier = self.verifier
        verifier.fetching(issuer, time.time())
        try:
            await self._fetch_keys(issuer)
        finally:
            verifier.done(issuer)

    async def _fetch_keys(self, issuer: str) -> None:
        verifier = self.verifier
        try:
            document = await fetch(issuer.rstrip("/") + DISCOVERY_PATH, self.context, self.timeout)
            jwks_uri = verifier.discovered(issuer, document)
            keys = await fetch(jwks_uri, self.context, self.timeout)
            count = verifier.keys(issuer, keys, time.time())
        except NoUsableKey as exc:
            # The issuer withdrew its keys (the held ones are dropped): said
            # once as a warning, until it has usable keys again.
            level = logging.INFO if issuer in self._empty else logging.WARNING
            self._empty.add(issuer)
            log.log(level, "OpenID Connect issuer %s: no usable signing key, its tokens are "
                    "refused: %s", issuer, exc)  # fmt: skip
            return
        except (FetchError, TokenRefused) as exc:
            verifier.failed(issuer, str(exc), time.time())
            log.warning("OpenID Connect issuer %s: keys not fetched: %s", issuer, exc)
            return
        self._empty.discard(issuer)
        log.info("OpenID Connect issuer %s: %d signing key(s)", issuer, count)

    async def run(self) -> None:
        """Fetch every issuer's keys now, then again when they are due; and
        the fetches clients ask for meanwhile."""
        async with trio.open_nursery() as background:
            self._nursery = background
            try:
                while True:
                    async with trio.open_nursery() as nursery:
                        for issuer in self.verifier.issuers:
                            if self.verifier.due(issuer, time.time()):
                                nursery.start_soon(self.fetch, issuer)
                    await trio.sleep(min(TICK, max(1.0, self.verifier.settings.refresh_after)))
            finally:
                self._nursery = None


async def own_token_once(
    credentials: ClientCredentials, context: ssl.SSLContext, timeout: float
) -> float | None:
    """Fetch Sluice's own token; its lifetime (None: not said). FetchError
    or TokenRefused when there is none."""
    if credentials.token_endpoint is None:
        credentials.discovered(await fetch(credentials.discovery_url, context, timeout))
    endpoint = credentials.token_endpoint
    assert endpoint is not None
    if _scheme(credentials.issuer) == "https" and _scheme(endpoint) != "https":
        # The client secret goes in the request: an https issuer's is not
        # sent in the clear, as a redirect to http is not followed either.
        raise FetchError(f"the token endpoint of {credentials.issuer} is "
                         f"{clipped(endpoint)}, not https")  # fmt: skip
    answer = await fetch(endpoint, context, timeout, body=credentials.request())
    return credentials.took(answer, time.time())


def _scheme(url: str) -> str:
    return urllib.parse.urlsplit(url).scheme.lower()


async def keep_own_token(
    credentials: ClientCredentials,
    context: ssl.SSLContext,
    timeout: float,
    *,
    task_status: trio.TaskStatus[str | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Fetch Sluice's own token, report started (whether or not it came:
    with None if it did, else why not; the broker refuses a missing one,
    saying so), and fetch it again before it expires, forever."""
    backoff = BACKOFF
    started = False
    while True:
        try:
            lifetime = await own_token_once(credentials, context, timeout)
        except (FetchError, TokenRefused) as exc:
            log.warning("own token from OAuth2 issuer %s not fetched (again in %gs): %s",
                        credentials.issuer, backoff, exc)  # fmt: skip
            if not started:
                started = True
                task_status.started(str(exc))
            await trio.sleep(backoff)
            backoff = min(MAX_BACKOFF, backoff * 2)
            continue
        backoff = BACKOFF
        now = time.time()
        at = credentials.refresh_at()
        if not math.isfinite(at):
            # No usable expires_in (missing, not a number, not finite): the
            # token's own exp, if it is a JWT that has one.
            exp = _token_exp(credentials.current())
            if exp is not None:
                lifetime = exp - now
                at = now + max(0.0, lifetime) * credentials.REFRESH_AT
        log.info("own token from OAuth2 issuer %s (%s)", credentials.issuer,
                 "no expiry" if not math.isfinite(at) else f"good for {lifetime:g}s")  # fmt: skip
        if not started:
            started = True
            task_status.started(None)
        wait = at - now
        await trio.sleep(max(MIN_REFRESH, wait) if math.isfinite(wait) else math.inf)


def _token_exp(token: bytes) -> float | None:
    """The ``exp`` of a JWT (unverified: Sluice's own token, as its issuer
    handed it over); None when it is none, or has none."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    exp = claims.get("exp")
    if not isinstance(exp, int | float) or isinstance(exp, bool) or not math.isfinite(exp):
        return None
    return float(exp)
