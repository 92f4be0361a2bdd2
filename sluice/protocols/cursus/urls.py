"""Cursus's broker URLs: ``cursus://host:port``, ``cursus+ssl://`` for a broker
that speaks TLS, or a bare ``host:port``."""

from __future__ import annotations

from sluice.protocols.cursus.frame import DEFAULT_PORT
from sluice.protocols.urls import BrokerUrl, parse_url

SCHEMES = ("cursus", "cursus+ssl")


def parse_cursus_url(text: str, *, what: str = "broker URL") -> BrokerUrl:
    return parse_url(text, SCHEMES, (DEFAULT_PORT, DEFAULT_PORT), what=what)
