"""Pulsar as the registry knows it (``sluice.protocols.registry``)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from sluice.config import seconds_or_zero
from sluice.protocols.faults import ProtocolFaults
from sluice.protocols.pulsar import pulsar_api_pb2 as pb
from sluice.protocols.pulsar.decoder import decode_frame
from sluice.protocols.pulsar.frame import Frame, command_name, standalone
from sluice.protocols.pulsar.redact import loggable
from sluice.protocols.pulsar.urls import DEFAULT_PORTS, SCHEMES, parse_broker_url
from sluice.protocols.registry import Option, ProtocolSpec


def _has_request_id(number: int) -> bool:
    """Whether the body of the command type ``number`` carries a request id."""
    body = pb.BaseCommand.DESCRIPTOR.fields_by_number[number].message_type
    return body is not None and "request_id" in body.fields_by_name


# What fault rules may name for Pulsar: its commands, and the ServerError an
# ``error`` rule answers with (ServiceNotReady, the one clients retry, first).
PULSAR_FAULTS = ProtocolFaults(
    "pulsar",
    frozenset(pb.BaseCommand.Type.keys()),
    ("ServiceNotReady", *(n for n, _ in pb.ServerError.items() if n != "ServiceNotReady")),
    # What an error rule can answer (the core's ``_fault``): a SEND, and a
    # command that carries a request id.
    requests=frozenset(
        name
        for name, number in pb.BaseCommand.Type.items()
        if name == "SEND" or _has_request_id(number)
    ),
)

# Request types whose latency is tracked (the answer is matched by the Correlator).
TIMED_COMMANDS = (
    "CONNECT",
    "LOOKUP",
    "PARTITIONED_METADATA",
    "PRODUCER",
    "SUBSCRIBE",
    "SEND",
    "GET_SCHEMA",
    "GET_TOPICS_OF_NAMESPACE",
    "GET_LAST_MESSAGE_ID",
    "SEEK",
    "UNSUBSCRIBE",
    "CLOSE_PRODUCER",
    "CLOSE_CONSUMER",
)


def _words(text: str) -> tuple[str, ...]:
    """A comma-separated list, as Pulsar's settings write one."""
    return tuple(word.strip() for word in text.split(",") if word.strip())


# --auth-mode proxy and what goes with it (ProxyConfig's fields of the same names).
OPTIONS = (
    Option(
        ("--auth-mode",),
        {
            "dest": "auth_mode",
            "choices": ["passthrough", "proxy"],
            "help": "who authenticates clients (default: passthrough)",
        },
    ),
    Option(
        ("--auth-token-secret-key",),
        {
            "dest": "auth_token_secret_key",
            "type": Path,
            "metavar": "FILE",
            "help": "proxy mode: check client tokens (HS256/384/512) with this secret key, the "
            "file the broker's tokenSecretKey names (at least 32 bytes; default: none)",
        },
    ),
    Option(
        ("--auth-token-public-key",),
        {
            "dest": "auth_token_public_key",
            "type": Path,
            "metavar": "FILE",
            "help": "proxy mode: check client tokens (RS*/PS*/ES*) with this public key (DER "
            "or PEM; RSA of at least 2048 bits), the file the broker's tokenPublicKey names "
            "(default: none)",
        },
    ),
    Option(
        ("--auth-token-role-claim",),
        {
            "dest": "auth_token_role_claim",
            "metavar": "CLAIM",
            "help": "proxy mode: the token claim that names the role (default: sub)",
        },
    ),
    Option(
        ("--auth-token-audience",),
        {
            "dest": "auth_token_audience",
            "metavar": "AUDIENCE",
            "help": "proxy mode: refuse tokens whose aud claim does not name AUDIENCE, as the "
            "broker's tokenAudience does (default: not checked)",
        },
    ),
    Option(
        ("--broker-auth-token-file",),
        {
            "dest": "broker_auth_token_file",
            "type": Path,
            "metavar": "FILE",
            "help": "proxy mode: Sluice's own token at the broker (a role in its proxyRoles; "
            "default: none, the --broker-tls-cert certificate is Sluice's credential)",
        },
    ),
    Option(
        ("--auth-oidc-issuers",),
        {
            "dest": "auth_oidc_issuers",
            "type": _words,
            "metavar": "URL,...",
            "help": "proxy mode: also accept tokens of these OpenID Connect issuers, checked "
            "with the keys each publishes (discovery, JWKS) as the broker's "
            "openIDAllowedTokenIssuers (default: none)",
        },
    ),
    Option(
        ("--auth-oidc-audiences",),
        {
            "dest": "auth_oidc_audiences",
            "type": _words,
            "metavar": "AUDIENCE,...",
            "help": "proxy mode: an issuer's token must name one of these in aud, as the "
            "broker's openIDAllowedAudiences (needed with --auth-oidc-issuers; default: none)",
        },
    ),
    Option(
        ("--auth-oidc-role-claim",),
        {
            "dest": "auth_oidc_role_claim",
            "metavar": "CLAIM",
            "help": "proxy mode: the claim of an issuer's token that names the role, a string "
            "or a list whose first is taken (default: sub)",
        },
    ),
    Option(
        ("--auth-oidc-leeway",),
        {
            "dest": "auth_oidc_leeway",
            "type": seconds_or_zero,
            "metavar": "SECONDS",
            "help": "proxy mode: clock skew allowed on exp, nbf and iat, as the broker's "
            "openIDAcceptedTimeLeewaySeconds (default: 0)",
        },
    ),
    Option(
        ("--auth-oidc-allow-http",),
        {
            "dest": "auth_oidc_allow_http",
            "action": "store_true",
            "help": "proxy mode: allow issuers and key sets over plain http, as the broker's "
            "openIDRequireIssuersUseHttps=false (tests only; default: https required)",
        },
    ),
    Option(
        ("--auth-oidc-refresh",),
        {
            "dest": "auth_oidc_refresh",
            "type": seconds_or_zero,
            "metavar": "SECONDS",
            "help": "proxy mode: an issuer's keys are fetched again when this old, as the "
            "broker's openIDCacheRefreshAfterWriteSeconds (default: 64800)",
        },
    ),
    Option(
        ("--auth-oidc-miss-refresh",),
        {
            "dest": "auth_oidc_miss_refresh",
            "type": seconds_or_zero,
            "metavar": "SECONDS",
            "help": "proxy mode: a token naming a key its issuer's set lacks fetches the set "
            "again, at most this often, as the broker's openIDKeyIdCacheMissRefreshSeconds "
            "(default: 300)",
        },
    ),
    Option(
        ("--auth-oidc-ca",),
        {
            "dest": "auth_oidc_ca",
            "type": Path,
            "metavar": "FILE",
            "help": "proxy mode: CA certificates (PEM) for https issuers, Sluice's own OAuth2 "
            "issuer too, as the broker's openIDTokenIssuerTrustCertsFilePath (default: the "
            "system's)",
        },
    ),
    Option(
        ("--broker-auth-oauth2-issuer",),
        {
            "dest": "broker_auth_oauth2_issuer",
            "metavar": "URL",
            "help": "proxy mode: Sluice's own token at the broker from this OAuth2 issuer "
            "(client credentials, fetched again before it expires), as the clients' "
            "AuthenticationOAuth2 issuerUrl (default: none)",
        },
    ),
    Option(
        ("--broker-auth-oauth2-credentials",),
        {
            "dest": "broker_auth_oauth2_credentials",
            "type": Path,
            "metavar": "FILE",
            "help": "proxy mode: the key file (JSON: client_id, client_secret) for "
            "--broker-auth-oauth2-issuer, as the clients' privateKey (default: none)",
        },
    ),
    Option(
        ("--broker-auth-oauth2-audience",),
        {
            "dest": "broker_auth_oauth2_audience",
            "metavar": "AUDIENCE",
            "help": "proxy mode: the audience Sluice asks its own token for (default: none)",
        },
    ),
    Option(
        ("--broker-auth-oauth2-scope",),
        {
            "dest": "broker_auth_oauth2_scope",
            "metavar": "SCOPE",
            "help": "proxy mode: the scope Sluice asks its own token for (default: none)",
        },
    ),
    Option(
        ("--forward-auth-data",),
        {
            "dest": "forward_auth_data",
            "action": "store_true",
            "help": "proxy mode: also pass the client's credentials on, as original_auth_data "
            "(lookups share a connection per role and token expiry, whatever the token's "
            "spelling; default: off)",
        },
    ),
)


def decode(raw: bytes, from_client: bool) -> Frame:
    """A recorded frame, decoded again (one recorded without its payload: up
    to its metadata)."""
    return decode_frame(standalone(raw))


def detail(raw: bytes, out: dict[str, Any], decode: Callable[[bytes, bool], Any]) -> Any:
    """A recorded frame decoded for sluice view: its command (credentials
    out), and its message metadata and payload in ``out``. (Pulsar frames
    decode alike in every recording: ``decode`` is not needed.)"""
    try:
        frame = decode_frame(standalone(raw))
    except Exception as exc:  # a recorded invalid frame: its bytes say the rest
        return {"undecodable": str(exc)}
    body = loggable(frame)
    decoded = MessageToDict(body, preserving_proto_field_name=True) if body is not None else {}
    meta = frame.metadata
    if meta is not None:
        out["metadata"] = MessageToDict(meta, preserving_proto_field_name=True)
        payload = bytes(frame.payload)
        if payload and "payload" not in out:
            out["payload"] = {
                "size": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest(),
                "text": payload[:2000].decode("utf-8", errors="replace"),
                "base64": base64.b64encode(payload[:2000]).decode(),
                "cut": len(payload) > 2000,
            }
    return decoded


def check(config: Any) -> None:
    """Pulsar's checks of a ``ProxyConfig``: key and token files that do not
    load for ``--auth-mode proxy`` are one line at start, not a failure later."""
    from sluice.protocols.pulsar.auth import proxy_auth  # jwt and cryptography: on use

    proxy_auth(config)


PROTOCOL = ProtocolSpec(
    name="pulsar",
    title="Pulsar",
    schemes=SCHEMES,
    default_port=DEFAULT_PORTS[0],
    parse_url=parse_broker_url,
    faults=PULSAR_FAULTS,
    timed=TIMED_COMMANDS,
    counted=None,
    messages=frozenset({"SEND", "MESSAGE"}),
    publish=("SEND", frozenset({"SEND_RECEIPT", "SEND_ERROR"})),
    command_name=command_name,
    decode=decode,
    backend="sluice.proxy.pulsar:make_backend",
    check_broker="sluice.proxy.pulsar:check_broker",
    summarizer="sluice.recording.pulsar:FrameRecorder",
    summaries="sluice.recording.pulsar:FrameSummaries",
    web=True,
    # HTTP lookups name brokers by their binary URLs: each gets a listener of
    # its own; the main listener serves binary lookups.
    port_per_broker=True,
    main_is_broker_listener=False,
    filters=True,
    anonymize="sluice.protocols.pulsar.anonymize:ANONYMIZER",
    # A client certificate login in passthrough mode, and a client proxy-mode
    # authentication refuses (connection.py).
    rejections=("tls_passthrough", "auth"),
    standalone=standalone,
    pcap_note="Sluice recording of Pulsar traffic (TCP, the broker's port 6650). Wireshark has "
    "no Pulsar dissector of its own: add a Pulsar Lua dissector, or read the decoded frames "
    "with `sluice inspect`",
    options=OPTIONS,
    options_title="authentication (Pulsar)",
    options_help="passthrough (the default): the broker authenticates each client with the "
    "client's own credentials. proxy: Sluice authenticates clients itself, logs in to "
    "the broker as a role in its proxyRoles, and names the client's role in "
    "original_principal, so the broker authorizes the client.",
    check=check,
    detail=detail,
    replay="sluice.replay.pulsar:replay",
    serve="sluice.replay.pulsar:serve",
)
