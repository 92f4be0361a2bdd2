"""Broker URLs: Pulsar's ``pulsar://host:port``, ``pulsar+ssl://host:port`` and bare
``host:port``; Cursus's ``cursus://host:port`` and ``cursus+ssl://host:port``."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.addresses import Address, parse_address
from sluice.errors import ConfigError
from sluice.protocols.cursus.frame import DEFAULT_PORT as CURSUS_PORT


@dataclass(frozen=True, slots=True)
class BrokerUrl:
    """``pulsar://host:port`` or ``pulsar+ssl://host:port`` (``scheme``
    names another protocol's upstream, e.g. ``cursus``)."""

    host: str
    port: int
    tls: bool
    scheme: str = ""

    @property
    def address(self) -> Address:
        return Address(self.host, self.port)

    def __str__(self) -> str:
        scheme = self.scheme or ("pulsar+ssl" if self.tls else "pulsar")
        return f"{scheme}://{self.address}"


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


def parse_cursus_url(text: str, *, what: str = "broker URL") -> BrokerUrl:
    """A Cursus broker: ``cursus://host:port``, ``cursus+ssl://`` for one that
    speaks TLS, or a bare ``host:port``."""
    scheme, sep, rest = text.strip().partition("://")
    if sep and scheme not in ("cursus", "cursus+ssl"):
        raise ConfigError(
            f"{what} {text!r}: a Cursus broker is cursus://HOST:PORT (cursus+ssl:// with TLS)"
        )
    address = parse_address((rest if sep else text).rstrip("/"), what=what,
                            default_port=CURSUS_PORT)  # fmt: skip
    tls = scheme == "cursus+ssl"
    return BrokerUrl(address.host, address.port, tls, "cursus+ssl" if tls else "cursus")
