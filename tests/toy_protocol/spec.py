"""The toy as the registry knows it (its I/O half named by strings: loaded on use)."""

from __future__ import annotations

from sluice.protocols.faults import ProtocolFaults
from sluice.protocols.registry import ProtocolSpec
from sluice.protocols.urls import BrokerUrl, parse_url
from tests.toy_protocol.codec import ANSWERS, REQUESTS, decode

IO = "tests.toy_protocol.io"


def parse(text: str, *, what: str) -> BrokerUrl:
    return parse_url(text, ("toy", "toy+ssl"), (7070, 7070), what=what)


PROTOCOL = ProtocolSpec(
    name="toy",
    title="Toy",
    schemes=("toy", "toy+ssl"),
    default_port=7070,
    parse_url=parse,
    faults=ProtocolFaults("toy", REQUESTS | ANSWERS, ("unavailable",)),
    timed=tuple(sorted(REQUESTS)),
    counted=REQUESTS | ANSWERS | {"INVALID"},
    messages=frozenset({"PUT"}),
    command_name=None,
    decode=decode,
    backend=f"{IO}:ToyBackend",
    check_broker="sluice.proxy.backend:check_reachable",
    port_per_broker=True,
    pcap_note="Sluice recording of Toy traffic: [u32 length][u32 crc32][text]",
    replay=f"{IO}:replay",
    serve=f"{IO}:serve",
)
