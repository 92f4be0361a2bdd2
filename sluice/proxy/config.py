"""Proxy settings and the parsing of the addresses and URLs they contain."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from sluice.protocols.pulsar import DEFAULT_MAX_MESSAGE_SIZE
from sluice.recording.writer import RecorderConfig


class ConfigError(ValueError):
    """A setting is invalid. The message is one line meant for the user."""


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BrokerUrl:
    """``pulsar://host:port`` or ``pulsar+ssl://host:port``."""

    host: str
    port: int
    tls: bool

    @property
    def address(self) -> Address:
        return Address(self.host, self.port)

    def __str__(self) -> str:
        scheme = "pulsar+ssl" if self.tls else "pulsar"
        return f"{scheme}://{self.address}"


def parse_address(text: str, *, what: str = "address", default_port: int | None = None) -> Address:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) into an Address."""
    value = text.strip()
    host, sep, port_text = value.rpartition(":")
    if not sep:
        if default_port is None:
            raise ConfigError(f"{what} {text!r}: expected HOST:PORT")
        host, port_text = value, str(default_port)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ConfigError(f"{what} {text!r}: missing host")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{what} {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{what} {text!r}: port {port} is out of range")
    return Address(host, port)


def parse_broker_url(text: str, *, what: str = "broker URL") -> BrokerUrl:
    """A broker URL, or a bare ``host:port`` (what CONNECT.proxy_to_broker_url holds)."""
    value = text.strip()
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "pulsar", value
    if scheme not in ("pulsar", "pulsar+ssl"):
        raise ConfigError(f"{what} {text!r}: scheme must be pulsar:// or pulsar+ssl://")
    tls = scheme == "pulsar+ssl"
    rest = rest.rstrip("/")
    if "," in rest:
        raise ConfigError(f"{what} {text!r}: give one broker, not a list")
    address = parse_address(rest, what=what, default_port=6651 if tls else 6650)
    return BrokerUrl(address.host, address.port, tls)


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


@dataclass(frozen=True)
class ProxyConfig:
    broker: BrokerUrl
    listen: Address | None = field(default_factory=lambda: Address("127.0.0.1", 6650))
    listen_tls: Address | None = None
    tls: TlsServerConfig | None = None
    broker_tls: TlsClientConfig = field(default_factory=TlsClientConfig)
    # Host patterns, CIDRs and ports that proxy_to_broker_url may name. Empty:
    # the configured broker and brokers named by its own answers.
    allow_broker: tuple[str, ...] = ()
    on_invalid: str = "reject"  # or "forward"
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    connect_timeout: float = 10.0
    handshake_timeout: float = 10.0
    keepalive_interval: float = 30.0
    drain_timeout: float = 20.0
    max_connections: int = 10_000
    max_connections_per_ip: int = 1_000
    max_concurrent_lookups: int = 1_000
    max_redirects: int = 5
    # HTTP endpoint for /metrics, /healthz, /readyz (None: off).
    admin: Address | None = None
    # Topics beyond this many share the label "other" in per-topic metrics.
    topic_metrics_limit: int = 100
    # Where and how to record traffic (None: not recording).
    record: RecorderConfig | None = None

    def __post_init__(self) -> None:
        if self.listen is None and self.listen_tls is None:
            raise ConfigError("nothing to listen on: give --listen or --listen-tls")
        if self.listen_tls is not None and self.tls is None:
            raise ConfigError("--listen-tls needs --tls-cert and --tls-key")
        if self.on_invalid not in ("reject", "forward"):
            raise ConfigError(f"--on-invalid must be reject or forward, not {self.on_invalid!r}")
        for name in (
            "connect_timeout",
            "handshake_timeout",
            "keepalive_interval",
            "drain_timeout",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive")
        for name in (
            "max_connections",
            "max_connections_per_ip",
            "max_concurrent_lookups",
            "max_message_size",
            "topic_metrics_limit",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
        if self.max_redirects < 0:
            raise ConfigError("--max-redirects must not be negative")

    def replace(self, **changes: object) -> ProxyConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
