"""Network addresses, and which of them Sluice may dial.

Pure values and rules, no I/O, so that protocol cores (which decide whether
a client may be relayed somewhere) and the proxy share them.

The allow-list: a client names the broker it wants (Pulsar's
``CONNECT.proxy_to_broker_url``), so without a check the proxy is an open
relay into whatever network it sits in. A rule is

    HOST_PATTERN[:PORTS]    glob over host names, e.g. ``broker-*.pulsar.svc:6650``
    CIDR[:PORTS]            e.g. ``10.0.0.0/8`` or ``10.1.0.0/16:6650-6651``
    [IPV6_CIDR]:PORTS       e.g. ``[fd00::/8]:6650``

where PORTS is ``*`` (the default), a port, or a range ``LO-HI``. Besides the
rules, brokers the upstream itself names (lookup answers, assigned broker
URLs) are learned and allowed: that is the whole allow-list when no rule is
given.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
import socket
from dataclasses import dataclass

from sluice.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


_IPV6_CHARS = frozenset("0123456789abcdefABCDEF:.")


def parse_address(text: str, *, what: str = "address", default_port: int | None = None) -> Address:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) into an Address."""
    value = text.strip()
    if value.startswith("[") and "]:" not in value:
        raise ConfigError(f"{what} {text!r}: expected [HOST]:PORT")
    host, sep, port_text = value.rpartition(":")
    if ":" in host and set(host) <= _IPV6_CHARS:  # ::1, or ::1:6650: which part is the port?
        raise ConfigError(f"{what} {text!r}: an IPv6 address goes in brackets: [HOST]:PORT")
    if not sep:
        if default_port is None:
            raise ConfigError(f"{what} {text!r}: expected HOST:PORT")
        host, port_text = value, str(default_port)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ConfigError(f"{what} {text!r}: missing host")
    if any(c.isspace() or c in "/[]@" for c in host):  # a URL, say
        raise ConfigError(f"{what} {text!r}: expected HOST:PORT")
    if not host.isprintable():  # the resolver stops at a NUL: not the host checked
        raise ConfigError(f"{what} {text!r}: a control character in the host")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{what} {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{what} {text!r}: port {port} is out of range")
    # Host names are the same in any case (DNS): one spelling, so that a
    # broker named Broker-1 by a client and broker-1 by a lookup answer is
    # one broker, its route (TLS, via the upstream) found either way.
    return Address(host.lower(), port)


def parse_host(text: str, *, what: str = "host") -> str:
    """A host name or IP address alone (``[v6]`` brackets allowed), no port."""
    host = text.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ConfigError(f"{what} is empty")
    if any(c.isspace() or c in "/[]@" for c in host) or not host.isprintable():
        raise ConfigError(f"{what} {text!r}: not a host name or IP address")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"{what} {text!r}: a host alone, without a port") from None
    return host


_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")


def server_name(text: str) -> str | None:
    """A DNS host name as TLS carries it in SNI, lower-cased without a
    trailing dot; None when it is not one (letters, digits and hyphens in
    dot-separated labels of at most 63, 253 in all; no IP addresses, which
    SNI never carries)."""
    name = text.lower().removesuffix(".")
    if not 0 < len(name) <= 253 or not name.isascii():
        return None
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        return None
    return name


def unmapped(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IPv4-mapped IPv6 address as the IPv4 address it stands for: one
    client however it is written (10.0.0.9, or ::ffff:10.0.0.9 as a
    dual-stack listener or a balancer writes it)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def client_host(host: str) -> str:
    """``host`` as connection limits count it: an IPv4-mapped address as
    its IPv4 address (``unmapped``), anything else as it is."""
    if "." not in host or ":" not in host:  # (no mapped address is either)
        return host
    try:
        return str(unmapped(ipaddress.ip_address(host)))
    except ValueError:
        return host


# The names of this machine that need no resolving.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine by a loopback address or ``localhost``."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.lower().removesuffix(".") == "localhost"


def is_own_host(host: str, listen_host: str, advertised: str | None = None) -> bool:
    """Whether ``host`` names this machine's listener bound to ``listen_host``,
    as far as can be told without resolving: the same host, a loopback
    name for a loopback or wildcard listener, or the ``advertised`` host.
    (A broker address that does would make Sluice dial itself.)"""
    hosts = {listen_host.lower()}
    if is_wildcard(listen_host) or is_loopback(listen_host):
        hosts |= LOOPBACK_NAMES
    if advertised:
        hosts.add(advertised.lower())
    return host.lower().removesuffix(".") in hosts


def is_wildcard(host: str) -> bool:
    """Whether ``host`` means every interface (0.0.0.0, ::), which no client can dial."""
    if host == "":
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def advertised(listen_host: str, port: int, override: str | None = None) -> Address:
    """The address clients are told to dial for a listener bound to ``listen_host``.

    The host as the operator wrote it (a TLS client checks the certificate
    against it, so the bound IP will not do), ``override`` when given, and
    this machine's name for a wildcard.
    """
    host = override or listen_host
    if is_wildcard(host):
        host = socket.gethostname()
    return Address(host, port)


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Rule:
    text: str
    hosts: str | None  # glob, lower-case
    network: Network | None
    ports: tuple[int, int]

    def matches(self, address: Address) -> bool:
        if not self.ports[0] <= address.port <= self.ports[1]:
            return False
        if self.network is not None:
            try:
                ip = ipaddress.ip_address(address.host)
            except ValueError:
                return False  # a name never matches a CIDR: no resolution here
            return ip in self.network
        assert self.hosts is not None
        return fnmatch.fnmatchcase(address.host.lower(), self.hosts)


def parse_rule(text: str, option: str = "--allow-broker") -> Rule:
    """One rule of ``option`` (``--allow-broker``, ``--trust-broker``)."""
    value = text.strip()
    if not value:
        raise ConfigError(f"{option}: empty rule")
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        ports_text = rest[1:] if rest.startswith(":") else "*"
        if rest and not rest.startswith(":"):
            raise ConfigError(f"{option} {text!r}: expected [IPV6_CIDR]:PORTS")
    elif value.count(":") == 1:
        host, _, ports_text = value.partition(":")
    else:
        host, ports_text = value, "*"
    ports = _ports(ports_text, text, option)
    network: Network | None = None
    hosts: str | None = None
    if "/" in host or is_ip(host):
        try:
            network = ipaddress.ip_network(host, strict=False)
        except ValueError as exc:
            raise ConfigError(f"{option} {text!r}: {exc}") from None
    else:
        if not host:
            raise ConfigError(f"{option} {text!r}: missing host pattern")
        hosts = host.lower()
    return Rule(text, hosts, network, ports)


def is_ip(host: str) -> bool:
    """Whether ``host`` is an IPv4 or IPv6 address (not a name)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _ports(text: str, rule: str, option: str) -> tuple[int, int]:
    if text in ("", "*"):
        return (0, 65535)
    lo_text, _, hi_text = text.partition("-")
    try:
        lo = int(lo_text)
        hi = int(hi_text) if hi_text else lo
    except ValueError:
        raise ConfigError(f"{option} {rule!r}: bad port {text!r}") from None
    if not 0 <= lo <= hi <= 65535:
        raise ConfigError(f"{option} {rule!r}: bad port range {text!r}")
    return (lo, hi)


class AllowList:
    def __init__(
        self, rules: tuple[str, ...] | list[str] = (), option: str = "--allow-broker"
    ) -> None:
        self.rules = [parse_rule(r, option) for r in rules]
        # Brokers the upstream named, each with when it was last named (on
        # the caller's clock; None: not said, taken as the next ``stale``).
        self._learned: dict[Address, float | None] = {}

    def learn(self, address: Address, now: float | None = None) -> None:
        """Allow a broker the upstream itself named (``now``: when)."""
        self._learned[Address(address.host.lower(), address.port)] = now

    def forget(self, address: Address) -> bool:
        """Stop allowing a learned broker (rules still admit what they
        admit); whether it was learned."""
        key = Address(address.host.lower(), address.port)
        if key not in self._learned:
            return False
        del self._learned[key]
        return True

    def stale(self, before: float, now: float) -> list[Address]:
        """The learned brokers last named before ``before``. One learned
        without a time (another worker's, read from the journal) is taken
        as named ``now``."""
        learned = self._learned
        for address, when in learned.items():
            if when is None:
                learned[address] = now
        return [address for address, when in learned.items() if when is not None and when < before]

    @property
    def learned(self) -> frozenset[Address]:
        return frozenset(self._learned)

    def knows(self, address: Address) -> bool:
        """Whether ``address`` was learned (named by the upstream itself)."""
        return Address(address.host.lower(), address.port) in self._learned

    def allows(self, address: Address) -> bool:
        if self.knows(address):
            return True
        return any(rule.matches(address) for rule in self.rules)


def names_this_server(host: str, port: int, listen: str) -> bool:
    """Whether an HTTP request's ``Host`` names a server on loopback: an IP
    address (no name another site's DNS can point here: DNS rebinding),
    ``localhost``, or the host it was told to listen on, with its port."""
    host = host.strip().lower()
    if host.startswith("["):
        name, sep, rest = host[1:].partition("]")
        if not sep or rest != f":{port}":
            return False
    else:
        name, sep, given = host.rpartition(":")
        if not sep or given != str(port) or ":" in name:
            return False
    if name in ("localhost", listen.lower()):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
