"""The proxy's settings: one typed record, each default stated once.

``sluice proxy``'s flags, ``SLUICE_*`` variables and the TOML file fill this
record (the command line takes its defaults from here); ``sluice demo`` and
the tests build it directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sluice.addresses import Address, AllowList, is_own_host, server_name
from sluice.errors import ConfigError
from sluice.filters.config import FilterSpec
from sluice.protocols import registry
from sluice.protocols.core import OnInvalid
from sluice.protocols.faults import ProtocolFaults, Rule
from sluice.protocols.http import HttpUrl
from sluice.protocols.urls import BrokerUrl
from sluice.proxy.dial import TlsClientConfig, TlsServerConfig
from sluice.proxy.inbound import ProxyProtocolIn, parse_sources
from sluice.recording.writer import RecorderConfig

# The largest message or frame size a setting may name: a Pulsar broker says
# its own limit as a signed 32-bit int, and a frame's length prefix is 32 bits.
_LARGEST_FRAME = 2**31 - 1


def __getattr__(name: str) -> dict[str, ProtocolFaults]:
    """``PROTOCOL_FAULTS``: what fault rules may name, by protocol (the
    registry's ``all_faults()``, asked when read)."""
    if name == "PROTOCOL_FAULTS":
        return registry.all_faults()
    raise AttributeError(name)


@dataclass(frozen=True)
class ProxyConfig:
    broker: BrokerUrl
    # A protocol the registry knows (the command line takes it from the
    # --broker scheme).
    protocol: str = registry.DEFAULT_PROTOCOL
    listen: Address | None = field(default_factory=lambda: Address("127.0.0.1", 6650))
    listen_tls: Address | None = None
    tls: TlsServerConfig | None = None
    broker_tls: TlsClientConfig = field(default_factory=TlsClientConfig)
    # Host patterns, CIDRs and ports that proxy_to_broker_url may name. Empty:
    # the configured broker and brokers named by its own answers.
    allow_broker: tuple[str, ...] = ()
    # Proxy mode: brokers (same rules) Sluice logs in to as itself though its
    # upstream never named them; also allowed. Empty: only those it named.
    trust_broker: tuple[str, ...] = ()
    on_invalid: OnInvalid = OnInvalid.REJECT
    # The largest message a client may send until a broker's CONNECTED says
    # otherwise (None: the protocol's own default, Pulsar's 5 MiB).
    max_message_size: int | None = None
    connect_timeout: float = 10.0
    handshake_timeout: float = 10.0
    keepalive_interval: float = 30.0
    drain_timeout: float = 20.0
    max_connections: int = 10_000
    max_connections_per_ip: int = 1_000
    max_concurrent_lookups: int = 1_000
    # Sluice's own connections to brokers, which carry lookups: one per
    # broker and set of credentials, at most this many per process.
    max_upstream_connections: int = 1_000
    max_redirects: int = 5
    # HTTP endpoint for /metrics, /healthz, /readyz (None: off).
    admin: Address | None = None
    # Topics beyond this many share the label "other" in per-topic metrics.
    topic_metrics_limit: int = 100
    # Where and how to record traffic (None: not recording).
    record: RecorderConfig | None = None
    # Bearer token for admin calls that change state (None: no such calls).
    admin_token: str | None = field(default=None, repr=False)
    # Fault rules in force from the start (more can be added on /faults).
    faults: tuple[Rule, ...] = ()
    # Pulsar: who authenticates clients. passthrough: the broker, with the
    # client's credentials; proxy: Sluice, which then logs in to the broker
    # as itself (a token from broker_auth_token_file, or the TLS client
    # certificate of broker_tls) naming the client's role. Clients may use
    # tokens (checked with the secret or public key file) and, when the TLS
    # listener asks for client certificates (tls.client_ca), certificates.
    auth_mode: str = "passthrough"
    auth_token_secret_key: Path | None = None
    auth_token_public_key: Path | None = None
    auth_token_role_claim: str = "sub"
    auth_token_audience: str | None = None
    broker_auth_token_file: Path | None = None
    forward_auth_data: bool = False
    # OpenID Connect issuers whose tokens clients may present (proxy mode),
    # checked as Apache Pulsar's provider does (protocols/oidc.py).
    auth_oidc_issuers: tuple[str, ...] = ()
    auth_oidc_audiences: tuple[str, ...] = ()
    auth_oidc_role_claim: str = "sub"
    auth_oidc_leeway: float = 0.0
    auth_oidc_allow_http: bool = False
    auth_oidc_refresh: float = 18 * 3600.0
    auth_oidc_miss_refresh: float = 300.0
    # Trust for https issuers (theirs and Sluice's own OAuth2 issuer; None:
    # the system's CAs).
    auth_oidc_ca: Path | None = None
    # Sluice's own token from an OAuth2 issuer (client credentials) instead
    # of broker_auth_token_file.
    broker_auth_oauth2_issuer: str | None = None
    broker_auth_oauth2_credentials: Path | None = None
    broker_auth_oauth2_audience: str | None = None
    broker_auth_oauth2_scope: str | None = None
    # Worker processes serving the listeners (1: this process serves them).
    workers: int = 1
    # Cursus: the largest frame a client may send (the broker's own limit;
    # its spec says 64 MiB) and the broker-wide compression it applies to
    # every frame it receives.
    max_frame_size: int = 16 * 1024 * 1024
    broker_compression: str = "none"
    # Port-per-broker (Cursus; Pulsar's brokers that HTTP lookups name): the
    # ports to open the per-broker listeners on (None: any free port) and
    # the host clients are told to dial (None: the --listen host, or this
    # host's name when that is a wildcard).
    listener_ports: tuple[int, int] | None = None
    advertise_host: str | None = None
    # Where to keep which of --listener-ports stands for which broker, so
    # that a restarted proxy gives every broker the port clients already
    # know it by (None: each start gives them anew).
    broker_ports_file: Path | None = None
    # --proxy-protocol-in: every listener (the protocol's and admin) takes a
    # PROXY protocol header (v1 or v2) from the sources in
    # proxy_protocol_from (CIDRs) and none from anyone else.
    proxy_protocol_in: bool = False
    proxy_protocol_from: tuple[str, ...] = ()
    # --proxy-protocol-out: a v2 header naming the client goes first on each
    # connection Sluice opens to a broker for a client.
    proxy_protocol_out: bool = False
    # --sni-route NAME=URL: TLS server names routed to a broker (URL) or
    # served by Sluice as usual ("self"); any route turns SNI routing on, as
    # --sni-routing does for brokers' own names alone.
    sni_route: tuple[str, ...] = ()
    sni_routing: bool = False
    # --http-listen: Pulsar's web port (admin REST API, HTTP lookups) relayed
    # to the broker's, --broker-http (None: no HTTP listener). Request bodies
    # are read whole (a redirect replays them) within http_max_body; a
    # request's head within http_max_header bytes and http_idle_timeout; a
    # request's whole exchange within http_request_timeout.
    http_listen: Address | None = None
    # --http-listen-tls: the same over TLS, with the certificate of --tls-cert.
    http_listen_tls: Address | None = None
    broker_http: HttpUrl | None = None
    http_max_body: int = 5 * 1024 * 1024
    http_max_header: int = 16 * 1024
    http_idle_timeout: float = 60.0
    http_request_timeout: float = 300.0
    http_max_connections: int = 1_000
    # --filter / [[filters]]: message filters, in the order they run
    # (sluice/filters/; checked and made when the proxy starts).
    filters: tuple[FilterSpec, ...] = ()
    # Logging as the command set it up at start (--log-level, --log-format):
    # here so that a reload that changes them says they wait for a restart.
    log_level: str = "info"
    log_format: str = "text"

    def __post_init__(self) -> None:
        if self.listen is None and self.listen_tls is None:
            raise ConfigError("nothing to listen on: give --listen or --listen-tls")
        if self.listen_tls is not None and self.tls is None:
            raise ConfigError("--listen-tls needs --tls-cert and --tls-key")
        if self.admin_token is not None and self.admin is None:
            raise ConfigError("--admin-token-file guards the admin endpoint: give --admin too")
        if not isinstance(self.on_invalid, OnInvalid):
            raise ConfigError(f"--on-invalid must be reject or forward, not {self.on_invalid!r}")
        for name in (
            "connect_timeout",
            "handshake_timeout",
            "keepalive_interval",
            "drain_timeout",
        ):
            if not 0 < getattr(self, name) < math.inf:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive")
        for name in (
            "max_connections",
            "max_connections_per_ip",
            "max_concurrent_lookups",
            "max_upstream_connections",
            "max_message_size",
            "topic_metrics_limit",
            "workers",
            "max_frame_size",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
        for name in ("max_message_size", "max_frame_size"):
            value = getattr(self, name)
            if value is not None and value > _LARGEST_FRAME:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be at most {_LARGEST_FRAME} "
                    "(a frame's length is a 32-bit field, and brokers say theirs as a "
                    "signed one)"
                )
        spec = registry.get(self.protocol)
        both = self.listen is not None and self.listen_tls is not None
        if spec.port_per_broker and spec.main_is_broker_listener and both:
            raise ConfigError(
                f"{spec.title} listens on --listen or on --listen-tls, not both: a client's "
                "TLS setting covers every broker, so the per-broker listeners speak what "
                "the main one does"
            )
        # Per-broker listeners are opened for every broker, or (the main
        # listener serving clients otherwise) for those HTTP lookups name.
        opens_ports = spec.port_per_broker and (spec.main_is_broker_listener or self.http_on)
        if opens_ports and self.workers > 1 and self.listener_ports is None:
            raise ConfigError(
                f"--workers with {spec.title} needs --listener-ports LOW-HIGH: the "
                "per-broker ports are bound at start by the supervisor and shared by the "
                "workers"
            )
        if self.broker_ports_file is not None and self.listener_ports is None:
            raise ConfigError("--broker-ports-file keeps the ports of --listener-ports: give both")
        if self.listener_ports is not None:
            low, high = self.listener_ports
            if not 0 < low <= high < 65536:
                raise ConfigError("--listener-ports must be LOW-HIGH, 1 to 65535")
        self._check_auth()
        AllowList(self.allow_broker)  # rules that do not parse: one line now
        AllowList(self.trust_broker, "--trust-broker")
        if self.max_redirects < 0:
            raise ConfigError("--max-redirects must not be negative")
        self._check_proxy_protocol()
        self._check_http()
        # The protocol's own checks last: they may load files (Pulsar's keys).
        if spec.check is not None:
            spec.check(self)

    @property
    def http_on(self) -> bool:
        """An HTTP listener, plain or TLS, relays the broker's web port."""
        return self.http_listen is not None or self.http_listen_tls is not None

    def _check_http(self) -> None:
        if self.http_listen_tls is not None and self.tls is None:
            raise ConfigError("--http-listen-tls needs --tls-cert and --tls-key")
        if not self.http_on:
            if self.broker_http is not None:
                raise ConfigError("--broker-http goes with --http-listen")
            return
        if self.broker_http is None:
            raise ConfigError("--http-listen needs --broker-http URL: the broker's web service")
        spec = registry.get(self.protocol)
        if not spec.web:
            raise ConfigError(f"--http-listen relays a broker's web port: {spec.title} has none")
        for name in ("http_idle_timeout", "http_request_timeout"):
            if not 0 < getattr(self, name) < math.inf:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive")
        for name in ("http_max_body", "http_max_header", "http_max_connections"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")

    def check_not_itself(self) -> None:
        """--broker or --broker-http naming a listener of Sluice's own: every
        connection would dial Sluice again, until no descriptor is left.
        Said for what can be told without resolving a name: the same host,
        a loopback name for a loopback or wildcard listener, or the
        advertised host. (Asked by the command line, which binds what it
        names; a configuration built in code keeps the default listener.)"""
        checks = [("--broker", self.broker.address, (self.listen, self.listen_tls))]
        if self.broker_http is not None:
            own_web = (self.http_listen, self.http_listen_tls)
            checks.append(("--broker-http", self.broker_http.address, own_web))
        for option, target, listeners in checks:
            for listen in listeners:
                if (
                    listen is not None
                    and listen.port == target.port
                    and is_own_host(target.host, listen.host, self.advertise_host)
                ):
                    raise ConfigError(
                        f"{option} {target} is Sluice's own listener ({listen}): it "
                        "would dial itself; name the broker's address"
                    )

    def _check_proxy_protocol(self) -> None:
        sources = parse_sources(self.proxy_protocol_from)
        if self.proxy_protocol_in and not sources:
            raise ConfigError(
                "--proxy-protocol-in needs --proxy-protocol-from CIDR,...: the balancers "
                "whose headers are believed"
            )
        if sources and not self.proxy_protocol_in:
            raise ConfigError("--proxy-protocol-from goes with --proxy-protocol-in")
        if self.sni_on and self.listen_tls is None:
            raise ConfigError("--sni-route and --sni-routing need a TLS listener (--listen-tls)")
        self.sni_routes()  # routes that do not parse: one line now

    @property
    def sni_on(self) -> bool:
        return self.sni_routing or bool(self.sni_route)

    def sni_routes(self) -> dict[str, BrokerUrl | None]:
        """--sni-route as server name -> broker (None: Sluice itself)."""
        routes: dict[str, BrokerUrl | None] = {}
        for rule in self.sni_route:
            text, sep, url = rule.partition("=")
            name = server_name(text.strip())
            if not sep or name is None:
                raise ConfigError(f"--sni-route {rule!r}: expected NAME=URL, NAME a DNS name")
            what = f"--sni-route {name}"
            if url.strip() == "self":
                routes[name] = None
            else:
                routes[name] = registry.get(self.protocol).url(url, what=what)
        return routes

    def _check_auth(self) -> None:
        if self.auth_mode not in ("passthrough", "proxy"):
            raise ConfigError(f"--auth-mode must be passthrough or proxy, not {self.auth_mode!r}")
        proxy_only = {
            "--auth-token-secret-key": self.auth_token_secret_key,
            "--auth-token-public-key": self.auth_token_public_key,
            "--broker-auth-token-file": self.broker_auth_token_file,
            "--forward-auth-data": self.forward_auth_data or None,
            "--auth-token-audience": self.auth_token_audience,
            "--trust-broker": self.trust_broker or None,
            "--auth-oidc-issuers": self.auth_oidc_issuers or None,
            "--auth-oidc-audiences": self.auth_oidc_audiences or None,
            "--auth-oidc-ca": self.auth_oidc_ca,
            "--broker-auth-oauth2-issuer": self.broker_auth_oauth2_issuer,
            "--broker-auth-oauth2-credentials": self.broker_auth_oauth2_credentials,
        }
        if self.auth_mode == "passthrough":
            given = [name for name, value in proxy_only.items() if value is not None]
            if given:
                raise ConfigError(f"{', '.join(given)}: only with --auth-mode proxy")
            roled = [spec.id for spec in self.filters if spec.roles]
            if roled:  # no client has a verified role: such a filter would run for nobody
                raise ConfigError(
                    f"filter {', '.join(repr(name) for name in roled)}: roles need "
                    "--auth-mode proxy (in passthrough no client has a verified role)"
                )
            return
        if self.auth_token_secret_key is not None and self.auth_token_public_key is not None:
            raise ConfigError(
                "--auth-token-secret-key or --auth-token-public-key: one key checks tokens"
            )
        client_certificates = self.tls is not None and self.tls.client_ca is not None
        if (
            self.auth_token_secret_key is None
            and self.auth_token_public_key is None
            and not self.auth_oidc_issuers
            and not client_certificates
        ):
            raise ConfigError(
                "--auth-mode proxy needs a way to check clients: --auth-token-secret-key, "
                "--auth-token-public-key, --auth-oidc-issuers, or TLS client certificates "
                "(--tls-client-ca)"
            )
        oauth2 = self.broker_auth_oauth2_issuer or self.broker_auth_oauth2_credentials
        if self.broker_auth_token_file is not None and oauth2:
            raise ConfigError(
                "--broker-auth-token-file or --broker-auth-oauth2-*: one own credential"
            )
        if self.broker_auth_token_file is None and not oauth2 and self.broker_tls.cert is None:
            raise ConfigError(
                "--auth-mode proxy needs Sluice's own credentials at the broker: "
                "--broker-auth-token-file, --broker-auth-oauth2-issuer and "
                "--broker-auth-oauth2-credentials, or --broker-tls-cert and --broker-tls-key"
            )

    @property
    def main_listen(self) -> Address:
        """The first listening address (plain, else TLS); port-per-broker
        listeners open on its host and speak what it speaks."""
        listen = self.listen if self.listen is not None else self.listen_tls
        assert listen is not None  # checked above: one of them is given
        return listen

    def replace(self, **changes: object) -> ProxyConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def proxy_protocol_in(config: ProxyConfig) -> ProxyProtocolIn | None:
    """``--proxy-protocol-in``: whose PROXY headers every listener reads (None: off)."""
    if not config.proxy_protocol_in:
        return None
    return ProxyProtocolIn(parse_sources(config.proxy_protocol_from), config.handshake_timeout)


class ListenError(OSError):
    """A port that cannot be listened on, with the flag that asked for it
    (``--listen``, ``--admin``, ...; "" when not known), so that the one
    line a user reads says which of their ports is taken."""

    def __init__(self, flag: str, address: object, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.flag, self.address, self.cause = flag, address, cause

    def __str__(self) -> str:
        if self.errno == errno.EADDRINUSE:
            why = "address already in use"
        elif self.errno == errno.EACCES:
            why = "permission denied"
        else:
            why = self.strerror or str(self.cause)
        flag = f" ({self.flag})" if self.flag else ""
        return f"cannot listen on {self.address}{flag}: {why}"


@contextlib.contextmanager
def listening_for(flag: str, address: object) -> Iterator[None]:
    """An OSError in the block (binding ``address`` for ``flag``) raised
    as a ListenError naming both."""
    try:
        yield
    except ListenError:
        raise
    except OSError as exc:
        raise ListenError(flag, address, exc) from None
