"""``sluice proxy``: options, startup checks, signals."""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import sys
from pathlib import Path

import trio

from sluice.addresses import parse_address, parse_host
from sluice.commands import path_arg
from sluice.config import ENV_PREFIX, config_path, default, seconds
from sluice.errors import ConfigError
from sluice.filters.chain import make_filters
from sluice.filters.config import FilterArgument
from sluice.logs import add_logging_arguments, setup_logging
from sluice.protocols import registry
from sluice.protocols.core import OnInvalid
from sluice.protocols.faults import load_rules
from sluice.protocols.http import parse_http_url
from sluice.proxy.allocator import keep_big_buffers
from sluice.proxy.config import ListenError, ProxyConfig
from sluice.proxy.dial import (
    TlsClientConfig,
    TlsServerConfig,
    server_ssl_context,
)
from sluice.proxy.server import Proxy, reload_when_asked, serve_until_signalled
from sluice.proxy.shared import check_ports_file
from sluice.proxy.workers import available_cpus, serve_workers
from sluice.recording.format import PAYLOAD_POLICIES, PayloadPolicy
from sluice.recording.retention import MIN_QUANTUM
from sluice.recording.triggers import Trigger, TriggerError, load_triggers
from sluice.recording.writer import RING_BYTES_WITH_SECONDS, RecorderConfig, ignore_file_size_signal

log = logging.getLogger("sluice")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    net = parser.add_argument_group("listening")
    net.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"plain listener (default: {default(ProxyConfig, 'listen')}, but none with "
        "--listen-tls for a port-per-broker protocol; 'none' to disable)",
    )
    net.add_argument("--listen-tls", metavar="HOST:PORT", help="TLS listener (default: none)")
    net.add_argument(
        "--tls-cert",
        type=path_arg,
        metavar="FILE",
        help="certificate chain (PEM) for --listen-tls (default: none)",
    )
    net.add_argument(
        "--tls-key", type=path_arg, metavar="FILE", help="private key (PEM) (default: none)"
    )
    net.add_argument(
        "--tls-client-ca",
        type=path_arg,
        metavar="FILE",
        help="require client certificates signed by this CA (default: not required)",
    )
    net.add_argument(
        "--proxy-protocol-in",
        action="store_true",
        help="take a PROXY protocol header (v1 or v2, as HAProxy and cloud balancers write "
        "it) on every listener, admin too, from the sources of --proxy-protocol-from, and "
        "none from anyone else: the client's address is then the header's (limits, logs, "
        "recordings); a missing, bad or unlisted header closes the connection",
    )
    net.add_argument(
        "--proxy-protocol-from",
        action="append",
        default=[],
        metavar="CIDR,...",
        help="the balancers whose PROXY headers are believed (repeatable; default: none)",
    )
    net.add_argument(
        "--sni-route",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="TLS listener: a client whose TLS server name (SNI) is NAME is relayed to the "
        "broker at URL, as Pulsar's SNI proxy mode wants; URL 'self': served by Sluice as "
        "usual. Names of brokers the cluster named are routed too; any other name gets a "
        "TLS alert (repeatable; default: no SNI routing)",
    )
    net.add_argument(
        "--sni-routing",
        action="store_true",
        help="route TLS server names that name brokers the cluster told Sluice about, "
        "without any --sni-route",
    )
    up = parser.add_argument_group("upstream")
    up.add_argument(
        "--broker",
        required=True,
        metavar="URL",
        help=", or ".join(
            f"{p.schemes[0]}://HOST:PORT ({p.schemes[1]}:// with TLS) of a {p.title} broker"
            for p in registry.protocols().values()
        )
        + "; the scheme says the protocol; required, no default",
    )
    up.add_argument(
        "--protocol",
        choices=registry.names(),
        help="the broker's protocol (default: from the --broker scheme, "
        f"{registry.DEFAULT_PROTOCOL} for host:port)",
    )
    up.add_argument(
        "--broker-tls-ca",
        type=path_arg,
        metavar="FILE",
        help="CA for brokers' certificates (default: system trust store)",
    )
    up.add_argument(
        "--broker-tls-no-verify-hostname",
        action="store_true",
        help="do not check broker certificates' host names (the certificates are still "
        "checked against --broker-tls-ca or the system's CAs)",
    )
    up.add_argument(
        "--broker-tls-cert",
        type=path_arg,
        metavar="FILE",
        help="client certificate for brokers that ask for one (default: none)",
    )
    up.add_argument(
        "--broker-tls-key", type=path_arg, metavar="FILE", help="client key (default: none)"
    )
    up.add_argument(
        "--allow-broker",
        action="append",
        default=[],
        metavar="PATTERN",
        help="brokers clients may be relayed to: host glob, CIDR, with optional "
        ":PORT or :LO-HI (repeatable; default: brokers the upstream names)",
    )
    up.add_argument(
        "--trust-broker",
        action="append",
        default=[],
        metavar="PATTERN",
        help="proxy mode: brokers Sluice logs in to with its own credential though the "
        "upstream never named them (same patterns as --allow-broker, and allowed too); "
        "a client naming any other broker its answers did not name is refused "
        "(repeatable; default: none, only the --broker and brokers its answers name)",
    )
    up.add_argument(
        "--proxy-protocol-out",
        action="store_true",
        help="send a PROXY protocol v2 header naming the client first on every connection "
        "to a broker made for a client (the broker must read it: Apache Pulsar's "
        "haProxyProtocolEnabled=true); Sluice's own lookup connections send none",
    )
    up.add_argument(
        "--max-redirects",
        type=int,
        default=default(ProxyConfig, "max_redirects"),
        metavar="N",
        help="redirects to follow before failing: a binary lookup's, and the 307/308 "
        "answers of brokers' web services (--http-listen)",
    )
    web = parser.add_argument_group(
        "HTTP (Pulsar's web port)",
        "the admin REST API (/admin/v2, /admin/v3), HTTP lookups (/lookup/v2) and the rest "
        "of a broker's web service, relayed with h11; see docs/proxy.md, HTTP",
    )
    web.add_argument(
        "--http-listen",
        metavar="HOST:PORT",
        help="HTTP listener relaying to --broker-http (default: none); a broker's 307/308 "
        "to another broker is followed by Sluice, HTTP lookup answers name Sluice",
    )
    web.add_argument(
        "--http-listen-tls",
        metavar="HOST:PORT",
        help="HTTPS listener, as --http-listen with --tls-cert and --tls-key (and "
        "--tls-client-ca for client certificates) (default: none)",
    )
    web.add_argument(
        "--broker-http",
        metavar="URL",
        help="http://HOST:PORT or https://HOST:PORT of the broker's (or the cluster's) web "
        "service, for --http-listen (default: none; https uses the --broker-tls-* options)",
    )
    web.add_argument(
        "--http-max-body",
        type=byte_size,
        default=default(ProxyConfig, "http_max_body"),
        metavar="SIZE",
        help="largest request body (read whole, so that a redirect can replay it; larger: "
        "413), and largest lookup or redirect answer Sluice reads (e.g. 5M)",
    )
    web.add_argument(
        "--http-max-header",
        type=byte_size,
        default=default(ProxyConfig, "http_max_header"),
        metavar="SIZE",
        help="largest request line and headers (larger: 431)",
    )
    web.add_argument(
        "--http-idle-timeout",
        type=seconds,
        default=default(ProxyConfig, "http_idle_timeout"),
        metavar="SECONDS",
        help="for a request's head to arrive whole (keep-alive connections idle this long "
        "are closed; a head begun and not finished: 408)",
    )
    web.add_argument(
        "--http-request-timeout",
        type=seconds,
        default=default(ProxyConfig, "http_request_timeout"),
        metavar="SECONDS",
        help="for the rest of an exchange: the body, the brokers' answers, redirects "
        "(no answer begun in time: 504)",
    )
    web.add_argument(
        "--http-max-connections",
        type=int,
        default=default(ProxyConfig, "http_max_connections"),
        metavar="N",
        help="HTTP client connections open at once; more are answered 503",
    )
    for spec in registry.protocols().values():
        if spec.options:
            title = spec.options_title or spec.name
            own = parser.add_argument_group(title, spec.options_help or None)
            for option in spec.options:
                own.add_argument(
                    *option.flags, default=default(ProxyConfig, option.kwargs["dest"]),
                    **option.kwargs,
                )  # fmt: skip
    cur = parser.add_argument_group("port-per-broker")
    cur.add_argument(
        "--listener-ports",
        metavar="LOW-HIGH",
        help="ports for the listener opened for each further broker answers name "
        "(port-per-broker: Cursus replies, Pulsar HTTP lookups, which get a plain and a TLS "
        "one with --listen and --listen-tls; default: any free port; "
        "needed with --workers, whose supervisor binds the whole range at start)",
    )
    cur.add_argument(
        "--broker-ports-file",
        metavar="FILE",
        type=path_arg,
        help="keep which of --listener-ports stands for which broker in FILE (created if "
        "missing), so that a restarted proxy gives each broker the port its clients know "
        "(default: each start gives them anew)",
    )
    cur.add_argument(
        "--advertise-host",
        metavar="HOST",
        help="host put in rewritten replies for clients to dial (default: the --listen host, "
        "or this host's name when that is a wildcard)",
    )
    pol = parser.add_argument_group("policy and limits")
    pol.add_argument(
        "--on-invalid",
        choices=[p.value for p in OnInvalid],
        default=default(ProxyConfig, "on_invalid").value,
        help="what to do with invalid frames from clients (default: %(default)s)",
    )
    pol.add_argument(
        "--max-message-size",
        type=int,
        default=default(ProxyConfig, "max_message_size"),
        metavar="BYTES",
        help="largest message accepted until a broker's CONNECTED says otherwise (default: "
        "the protocol's own, 5 MiB for Pulsar)",
    )
    pol.add_argument(
        "--max-connections",
        type=int,
        default=default(ProxyConfig, "max_connections"),
        metavar="N",
        help="client connections open at once; more are refused",
    )
    pol.add_argument(
        "--max-connections-per-ip",
        type=int,
        default=default(ProxyConfig, "max_connections_per_ip"),
        metavar="N",
        help="client connections open at once from one IP address",
    )
    pol.add_argument(
        "--max-concurrent-lookups",
        type=int,
        default=default(ProxyConfig, "max_concurrent_lookups"),
        metavar="N",
        help="lookups in flight at once; more are answered TooManyRequests",
    )
    pol.add_argument(
        "--max-upstream-connections",
        type=int,
        default=default(ProxyConfig, "max_upstream_connections"),
        metavar="N",
        help="Sluice's own connections to brokers, which carry lookups (one per broker and "
        "client credentials; in proxy mode per client role), per process; at N the least "
        "recently used idle one is closed, and with none idle a lookup is answered "
        "TooManyRequests",
    )
    pol.add_argument(
        "--connect-timeout",
        type=seconds,
        default=default(ProxyConfig, "connect_timeout"),
        metavar="SECONDS",
        help="dialling a broker, TLS included",
    )
    pol.add_argument(
        "--handshake-timeout",
        type=seconds,
        default=default(ProxyConfig, "handshake_timeout"),
        metavar="SECONDS",
        help="for a client's CONNECT, and for a broker's CONNECTED",
    )
    pol.add_argument(
        "--keepalive-interval",
        type=seconds,
        default=default(ProxyConfig, "keepalive_interval"),
        metavar="SECONDS",
        help="ping idle lookup connections this often; close after twice this silent",
    )
    pol.add_argument(
        "--drain-timeout",
        type=seconds,
        default=default(ProxyConfig, "drain_timeout"),
        metavar="SECONDS",
        help="how long SIGTERM waits for connections to hand over",
    )
    pol.add_argument(
        "--workers",
        default=str(default(ProxyConfig, "workers")),
        metavar="N",
        help="worker processes serving the same ports, or 'auto' for one per CPU this "
        "process may use (affinity and cgroup quota); 1 keeps everything in this process",
    )
    pol.add_argument(
        "--no-check-broker",
        action="store_true",
        help="start even if the broker cannot be reached yet",
    )
    rec = parser.add_argument_group("recording")
    rec.add_argument(
        "--record",
        type=path_arg,
        metavar="DIR",
        help="record every frame into DIR (default: not recording)",
    )
    rec.add_argument(
        "--record-payloads",
        choices=PAYLOAD_POLICIES,
        default=default(RecorderConfig, "payloads").value,
        help="message payloads: full, hash (size and SHA-256, the default) or none; "
        "credentials are never recorded",
    )
    rec.add_argument(
        "--record-lossless",
        action="store_true",
        help="slow traffic down rather than drop frames when the disk falls behind",
    )
    rec.add_argument(
        "--record-max-bytes",
        type=byte_size,
        default=default(RecorderConfig, "max_file_bytes"),
        metavar="SIZE",
        help="start a new file after this many bytes, e.g. 64M (default: %(default)s; with "
        "--record-retain-bytes at most a quarter of it, shared among the workers)",
    )
    rec.add_argument(
        "--record-max-age",
        type=seconds,
        default=default(RecorderConfig, "max_file_age"),
        metavar="SECONDS",
        help="start a new file after this long",
    )
    rec.add_argument(
        "--record-flush-interval",
        type=seconds,
        default=default(RecorderConfig, "flush_interval"),
        metavar="SECONDS",
        help="how often written records are flushed (what a crash can lose)",
    )
    rec.add_argument(
        "--record-ring",
        type=ring_size,
        metavar="SIZE|SECONDS",
        help="flight recorder: keep only the recent past in memory (e.g. 64M, or 300s), "
        "no disk writes; snapshots (POST /recording/snapshot, `sluice record snapshot`, "
        "--snapshot-on) write it to --record DIR (default: off, record to files)",
    )
    rec.add_argument(
        "--snapshot-on",
        metavar="RULES",
        help="flight recorder: save a snapshot by itself on a broker error, an invalid "
        "frame, an injected fault, a slow request or a broker hang-up; RULES is a JSON "
        "file or JSON text (see docs/recording-format.md; default: none)",
    )
    rec.add_argument(
        "--record-retain-bytes",
        type=byte_size,
        metavar="SIZE",
        help="keep the recording directory under SIZE at every moment (e.g. 800M, 2G): the "
        "oldest files go first, never one being written; a frame larger than a quarter of "
        "SIZE (shared among the workers) is not recorded (default: no limit)",
    )
    rec.add_argument(
        "--record-retain-age",
        type=seconds,
        metavar="SECONDS",
        help="remove recording files last written more than SECONDS ago (default: never)",
    )
    obs = parser.add_argument_group("observability")
    obs.add_argument(
        "--admin",
        metavar="HOST:PORT",
        help="serve /metrics, /healthz, /readyz and /faults here (default: off)",
    )
    obs.add_argument(
        "--admin-token-file",
        type=path_arg,
        metavar="FILE",
        help="bearer token (the file's first line) that admin calls changing state need, "
        "such as adding fault rules; a file, so the token never shows in ps "
        "(default: none, no such calls)",
    )
    obs.add_argument(
        "--faults",
        type=path_arg,
        metavar="FILE",
        help="fault rules (JSON list) in force from the start; see docs/faults.md (default: none)",
    )
    filters = parser.add_argument_group(
        "message filters",
        "filters act on the messages producers send and brokers deliver: pass, change or "
        "refuse each one; built in: schema (validation against the topic's schema), "
        "encrypt (Pulsar's end-to-end encryption at the edge). "
        "See docs/filters.md",
    )
    filters.add_argument(
        "--filter",
        "--filters",
        dest="filters",
        action="append",
        type=FilterArgument(),
        metavar="NAME[:JSON]",
        help="run filter NAME (an entry point of group sluice.filters, or module:attr) on "
        "the messages of the topics, directions and roles the JSON object names: "
        '\'schema:{"topics": ["persistent://public/default/orders*"], "direction": "produce"}\'; '
        "repeat for more, in the order they run; in the TOML file, [[filters]] tables "
        "(default: none)",
    )
    obs.add_argument(
        "--topic-metrics-limit",
        type=int,
        default=default(ProxyConfig, "topic_metrics_limit"),
        metavar="N",
        help="topics with their own metric labels; the rest share 'other'",
    )
    add_logging_arguments(parser)


def checked_config(args: argparse.Namespace) -> ProxyConfig:
    """``config_from``, with what slips past its checks (a URL with a stray
    bracket, JSON nested past Python's limit) refused in one line too:
    never a traceback at start, never a running proxy ended by a reload."""
    try:
        return config_from(args)
    except ConfigError:
        raise
    except (ValueError, RecursionError) as exc:
        problem = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise ConfigError(f"a setting does not check out: {problem}") from None


def _cannot_hold(directory: Path) -> str | None:
    """Why ``directory`` (made at start if missing) cannot hold recordings,
    in words; None if it can. Nothing is made here (``--print-config``)."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} cannot be written (permission denied)"
    return None


def config_from(args: argparse.Namespace) -> ProxyConfig:
    spec = registry.get(args.protocol) if args.protocol else registry.by_url(args.broker)
    listen_tls = parse_address(args.listen_tls, what="--listen-tls") if args.listen_tls else None
    if args.listen is None:  # not given: port-per-broker listens one way only (see ProxyConfig)
        listen = None if spec.port_per_broker and listen_tls else default(ProxyConfig, "listen")
    elif args.listen in ("", "none"):
        listen = None
    else:
        listen = parse_address(args.listen, what="--listen")
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        for path in (args.tls_cert, args.tls_key, args.tls_client_ca):
            if path is not None and not path.is_file():
                raise ConfigError(f"no such file: {path}")
        tls = TlsServerConfig(args.tls_cert, args.tls_key, args.tls_client_ca)
        server_ssl_context(tls)  # files that do not load: one line now, not at the first client
    ports_file = args.broker_ports_file
    if ports_file is not None and ports_file.is_dir():
        raise ConfigError(f"--broker-ports-file {ports_file}: is a directory")
    if ports_file is not None and not (ports_file.is_file() or ports_file.parent.is_dir()):
        raise ConfigError(f"--broker-ports-file: no such directory: {ports_file.parent}")
    if ports_file is not None:
        check_ports_file(ports_file)  # one that cannot be written: said now, not by each worker
    if args.broker_tls_ca is not None and not args.broker_tls_ca.is_file():
        raise ConfigError(f"no such file: {args.broker_tls_ca}")
    config = ProxyConfig(
        broker=spec.url(args.broker, what="--broker"),
        protocol=spec.name,
        # Every protocol's own settings: one given for another protocol is
        # refused by that protocol's check, not dropped.
        **{
            o.kwargs["dest"]: getattr(args, o.kwargs["dest"])
            for p in registry.protocols().values()
            for o in p.options
        },
        listener_ports=port_range(args.listener_ports) if args.listener_ports else None,
        broker_ports_file=args.broker_ports_file,
        advertise_host=(
            parse_host(args.advertise_host, what="--advertise-host")
            if args.advertise_host is not None
            else None
        ),
        listen=listen,
        listen_tls=listen_tls,
        tls=tls,
        broker_tls=TlsClientConfig(
            ca=args.broker_tls_ca,
            verify_hostname=not args.broker_tls_no_verify_hostname,
            cert=args.broker_tls_cert,
            key=args.broker_tls_key,
        ),
        allow_broker=tuple(args.allow_broker),
        trust_broker=tuple(args.trust_broker),
        proxy_protocol_in=args.proxy_protocol_in,
        proxy_protocol_from=tuple(args.proxy_protocol_from),
        proxy_protocol_out=args.proxy_protocol_out,
        sni_route=tuple(args.sni_route),
        sni_routing=args.sni_routing,
        on_invalid=OnInvalid(args.on_invalid),
        max_message_size=args.max_message_size,
        connect_timeout=args.connect_timeout,
        handshake_timeout=args.handshake_timeout,
        keepalive_interval=args.keepalive_interval,
        drain_timeout=args.drain_timeout,
        max_connections=args.max_connections,
        max_connections_per_ip=args.max_connections_per_ip,
        max_concurrent_lookups=args.max_concurrent_lookups,
        max_upstream_connections=args.max_upstream_connections,
        max_redirects=args.max_redirects,
        http_listen=(
            parse_address(args.http_listen, what="--http-listen") if args.http_listen else None
        ),
        http_listen_tls=(
            parse_address(args.http_listen_tls, what="--http-listen-tls")
            if args.http_listen_tls
            else None
        ),
        broker_http=(
            parse_http_url(args.broker_http, what="--broker-http") if args.broker_http else None
        ),
        http_max_body=args.http_max_body,
        http_max_header=args.http_max_header,
        http_idle_timeout=args.http_idle_timeout,
        http_request_timeout=args.http_request_timeout,
        http_max_connections=args.http_max_connections,
        admin=parse_address(args.admin, what="--admin") if args.admin else None,
        topic_metrics_limit=args.topic_metrics_limit,
        record=_recorder_config(args),
        admin_token=read_token(args.admin_token_file),
        faults=tuple(load_rules(args.faults, registry.all_faults())) if args.faults else (),
        workers=parse_workers(args.workers),
        log_level=getattr(args, "log_level", "info"),
        log_format=getattr(args, "log_format", "text"),
        filters=tuple(args.filters or ()),
    )
    config.check_not_itself()
    if config.filters:  # every mistake said now, not in each worker
        make_filters(config.filters, spec)
    return config


def port_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    try:
        return (int(low), int(high) if sep else int(low))
    except ValueError:
        raise ConfigError(
            f"--listener-ports {text!r}: expected LOW-HIGH, e.g. 19000-19099"
        ) from None


# The most --workers: each is a process; a count past this is a typo, which
# the supervisor would take as a table of that many workers to start.
MAX_WORKERS = 1024


def parse_workers(text: str) -> int:
    """``--workers``: a count, or ``auto`` for the CPUs this process may use."""
    if text.strip().lower() == "auto":
        return min(available_cpus(), MAX_WORKERS)
    try:
        count = int(text)
    except ValueError:
        raise ConfigError(f"--workers must be a number or auto, not {text!r}") from None
    if count > MAX_WORKERS:
        raise ConfigError(f"--workers must be at most {MAX_WORKERS}, not {text}")
    return count


def read_token(path: Path | None) -> str | None:
    """The admin token in ``path`` (its first line), or None without a file."""
    if path is None:
        return None
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"--admin-token-file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--admin-token-file {path}: not text") from None
    token = lines[0].strip() if lines else ""
    if not token:
        raise ConfigError(f"--admin-token-file {path}: the file is empty")
    return token


def _recorder_config(args: argparse.Namespace) -> RecorderConfig | None:
    if args.record is None:
        if args.record_ring is not None or args.snapshot_on is not None:
            raise ConfigError("--record-ring and --snapshot-on need --record DIR, where "
                              "snapshots are written")  # fmt: skip
        return None
    ring_bytes = None
    if args.record_ring is not None:
        ring_bytes = args.record_ring[0] or RING_BYTES_WITH_SECONDS
    retain = args.record_retain_bytes
    # Each worker has its own ring and writes its own snapshot: each gets an
    # equal share of the directory's bound.
    workers = max(1, parse_workers(args.workers))
    if retain is not None and retain < MIN_QUANTUM * 4 * workers:
        raise ConfigError(
            f"--record-retain-bytes {retain} is too small for {workers} worker(s): each "
            f"writes up to a quarter of its share ({retain // (4 * workers)} bytes) between "
            f"two retention passes and needs {MIN_QUANTUM}; give at least "
            f"{MIN_QUANTUM * 4 * workers}"
        )
    if ring_bytes is not None and retain is not None and ring_bytes > retain * 3 // (4 * workers):
        shared = f" shared by {workers} workers, each with its ring," if workers > 1 else ""
        raise ConfigError(
            f"--record-ring holds up to {ring_bytes} bytes, more than three quarters of "
            f"--record-retain-bytes ({retain}){shared}: a snapshot of it would not fit; give "
            "the ring less or keep more"
        )
    triggers: list[Trigger] = []
    if args.snapshot_on is not None:
        if args.record_ring is None:
            raise ConfigError("--snapshot-on needs the flight recorder: give --record-ring")
        try:
            triggers = load_triggers(args.snapshot_on, registry.all_faults())
        except TriggerError as exc:
            raise ConfigError(f"--snapshot-on: {exc}") from None
    if args.record.exists() and not args.record.is_dir():
        raise ConfigError(f"--record {args.record}: exists and is not a directory")
    problem = _cannot_hold(args.record)
    if problem is not None:  # said now, not as the writer's failure once serving
        raise ConfigError(f"--record {args.record}: {problem}")
    for name in ("record_max_bytes", "record_max_age", "record_flush_interval",
                 "record_retain_bytes", "record_retain_age"):  # fmt: skip
        value = getattr(args, name)
        if value is not None and not 0 < value < math.inf:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive")
    if args.record_max_bytes is not None and args.record_max_bytes < MIN_FILE_BYTES:
        # A file starts with its header and the open connections restated, so
        # a smaller cap made one file per write, each over the cap anyway.
        raise ConfigError(f"--record-max-bytes {args.record_max_bytes} cannot hold a file's "
                          f"header and a record; give at least {MIN_FILE_BYTES}")  # fmt: skip
    return RecorderConfig(
        directory=args.record,
        payloads=PayloadPolicy(args.record_payloads),
        lossless=args.record_lossless,
        max_file_bytes=args.record_max_bytes,
        max_file_age=args.record_max_age,
        flush_interval=args.record_flush_interval,
        retain_bytes=args.record_retain_bytes,
        retain_age=args.record_retain_age,
        ring_bytes=args.record_ring[0] if args.record_ring else None,
        ring_seconds=args.record_ring[1] if args.record_ring else None,
        triggers=tuple(triggers),
    )


# The smallest --record-max-bytes: a file's header, its restated connections
# and a record fit (the golden captures use this much to get many files).
MIN_FILE_BYTES = 4096

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def byte_size(text: str) -> int:
    """A size in bytes: 1048576, 512K, 800M, 2G (binary units; KiB/MiB/GiB too)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1:] if value[-1:] in _UNITS else ""
    number = value[: len(value) - len(unit)]
    try:
        size = float(number) * _UNITS[unit]
    except ValueError:
        size = math.nan
    if not math.isfinite(size):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 800M, 2G)")
    if int(size) < 1:  # (0.5 is no byte: not a size that rounds to nothing)
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be at least one byte")
    return int(size)


def ring_size(text: str) -> tuple[int | None, float | None]:
    """--record-ring: a size (64M) or a time (300s): (bytes, seconds)."""
    value = text.strip().lower()
    if value.endswith("s") and not value.endswith("bs"):
        try:
            float(value[:-1])
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a size or a time "
                                             "(e.g. 64M, 300s)") from None  # fmt: skip
        return None, seconds(value[:-1])
    return byte_size(text), None


class StartupError(Exception):
    """A one-line reason the proxy cannot start."""


async def check_broker(config: ProxyConfig) -> None:
    """The broker answers, by its protocol's own check."""
    spec = registry.get(config.protocol)
    problem = await spec.load(spec.check_broker)(config)
    if problem is not None:
        raise StartupError(f"{problem} (start anyway with --no-check-broker)")


async def serve(
    config: ProxyConfig,
    check: bool = True,
    logs: tuple[str, str] = ("info", "text"),
    argv: list[str] | None = None,
) -> None:
    """Serve ``config``; with ``argv`` (the command line it came from), its
    settings are read again on SIGHUP, a changed --config file, or the
    admin endpoint's POST /config/reload."""
    if check:
        await check_broker(config)
    load = functools.partial(settings_again, argv) if argv is not None else None
    config_file = _config_file(argv)
    if config.workers > 1:
        try:
            await serve_workers(config, config.workers, *logs, load=load, config_file=config_file)
        except OSError as exc:
            raise StartupError(listen_error(exc, config)) from None
        except ConfigError as exc:  # --broker-ports-file another proxy holds
            raise StartupError(str(exc)) from None
        return
    try:
        proxy = Proxy(config)
    except ConfigError as exc:  # --broker-ports-file another proxy holds
        raise StartupError(str(exc)) from None
    proxy.load = load
    failure: OSError | ConfigError | None = None
    async with trio.open_nursery() as nursery:
        try:
            await nursery.start(proxy.run)
        # Raised before the proxy's own nurseries open: a port taken, or a
        # certificate that stopped loading since config_from checked it.
        except (OSError, ConfigError) as exc:
            failure = exc
            nursery.cancel_scope.cancel()
        else:
            for kind, address in proxy.addresses.items():
                log.info("listening (%s) on %s, upstream %s", kind, address, config.broker)
            if load is not None:
                nursery.start_soon(reload_when_asked, proxy, config_file)
            await serve_until_signalled(proxy)
            nursery.cancel_scope.cancel()
    if isinstance(failure, ConfigError):
        raise StartupError(str(failure))
    if failure is not None:
        raise StartupError(listen_error(failure, config))
    log.info("stopped")


def settings_again(argv: list[str]) -> ProxyConfig:
    """The proxy's settings from its command line, read again."""
    from sluice.commands import parse_again  # the command table imports this module

    return checked_config(parse_again(argv))


def _config_file(argv: list[str] | None) -> Path | None:
    """The --config file of a command line (or SLUICE_CONFIG), to watch."""
    if argv is None:
        return None
    text = config_path(argv) or os.environ.get(f"{ENV_PREFIX}CONFIG")
    return Path(text) if text else None


def listen_error(exc: OSError, config: ProxyConfig, names: dict[str, str] | None = None) -> str:
    """One line for a port Sluice cannot listen on: the address and the flag
    that asked for it (``names``: a command's own name for a flag, as
    ``sluice demo``'s ``--port`` for ``--listen``)."""
    if isinstance(exc, ListenError):
        flag = (names or {}).get(exc.flag, exc.flag)
        return str(ListenError(flag, exc.address, exc.cause))
    if exc.errno is None:  # a message of its own, naming what it is about
        return str(exc)
    where = ", ".join(
        str(a)
        for a in (
            config.listen,
            config.listen_tls,
            config.admin,
            config.http_listen,
            config.http_listen_tls,
        )
        if a is not None
    )
    return str(ListenError("", where, exc))


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    keep_big_buffers()
    ignore_file_size_signal()
    try:
        config = checked_config(args)
    except ConfigError as exc:
        for line in str(exc).splitlines():
            print(f"sluice proxy: {line}", file=sys.stderr)
        return 2
    try:
        trio.run(serve, config, not args.no_check_broker, (args.log_level, args.log_format),
                 getattr(args, "argv", None))  # fmt: skip
    except StartupError as exc:
        log.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        log.error("internal error: %r (run with --log-level debug for details)", exc)
        log.debug("internal error", exc_info=exc)
        return 70
    return 0
