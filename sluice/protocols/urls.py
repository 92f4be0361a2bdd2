"""Broker URLs, protocol-neutral: ``SCHEME://host:port``, ``SCHEME+ssl`` (or
whatever TLS scheme the protocol names) for brokers that speak TLS, or a
bare ``host:port`` (the protocol's plain scheme)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.addresses import Address, parse_address
from sluice.errors import ConfigError


@dataclass(frozen=True, slots=True)
class BrokerUrl:
    """One broker: where it is, whether it speaks TLS, and the scheme it was
    written with (a spelling: two URLs of one broker compare equal)."""

    host: str
    port: int
    tls: bool
    scheme: str = field(default="", compare=False)

    @property
    def address(self) -> Address:
        return Address(self.host, self.port)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.address}" if self.scheme else str(self.address)


def parse_url(
    text: str, schemes: tuple[str, str], default_ports: tuple[int, int], *, what: str
) -> BrokerUrl:
    """``text`` as a URL of one of ``schemes`` (plain, TLS); ``default_ports``
    likewise, for a URL without a port."""
    value = text.strip()
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = schemes[0], value
    if scheme not in schemes:
        raise ConfigError(f"{what} {text!r}: scheme must be {schemes[0]}:// or {schemes[1]}://")
    tls = scheme == schemes[1]
    rest = rest.rstrip("/")
    if "," in rest:
        raise ConfigError(f"{what} {text!r}: give one broker, not a list")
    address = parse_address(rest, what=what, default_port=default_ports[tls])
    return BrokerUrl(address.host, address.port, tls, scheme)
