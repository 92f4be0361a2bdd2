"""Pulsar's broker URLs: ``pulsar://host:port``, ``pulsar+ssl://host:port`` and
bare ``host:port`` (what CONNECT.proxy_to_broker_url holds)."""

from __future__ import annotations

from sluice.protocols.urls import BrokerUrl, parse_url

__all__ = ["SCHEMES", "BrokerUrl", "parse_broker_url"]

SCHEMES = ("pulsar", "pulsar+ssl")
DEFAULT_PORTS = (6650, 6651)


def parse_broker_url(text: str, *, what: str = "broker URL") -> BrokerUrl:
    """A broker URL, or a bare ``host:port``."""
    return parse_url(text, SCHEMES, DEFAULT_PORTS, what=what)
