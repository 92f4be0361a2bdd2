"""A configuration reloaded without a restart: what may change live, and
the record of each reload.

A reload reads the settings again as at start (the same flags and
environment, the ``--config`` and ``SLUICE_DEFAULTS`` files as they are
now), on ``SIGHUP``, when the ``--config`` file, the ``SLUICE_DEFAULTS``
file or a file of FILES changes (``server.reload_when_asked``),
or on ``POST /config/reload`` at the admin endpoint. What it may change
while connections stay open (``LIVE``) is put in force; a changed setting
outside it (listeners, the broker, the worker count, …) is named
in one line and kept as it was, until a restart. A configuration that does
not check out is refused as a whole, one line per mistake, and the one in
force stays. Each configuration put in force is a *generation* (1 at
start), shown by ``GET /config`` and the metrics
``sluice_config_generation`` and ``sluice_config_reloads_total{outcome}``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from sluice.config import defaults_path
from sluice.errors import ConfigError

# ProxyConfig fields a reload puts in force; the rest need a restart.
LIVE = frozenset(
    {
        # who may be dialled, and whose credential goes where
        "allow_broker",
        "trust_broker",
        # fault rules of the configuration (those added on /faults stay)
        "faults",
        # limits
        "max_connections",
        "max_connections_per_ip",
        "http_max_connections",
        "max_concurrent_lookups",
        "max_upstream_connections",
        "max_redirects",
        # authentication at the proxy: keys, issuers, Sluice's own credential
        "auth_mode",
        "auth_token_secret_key",
        "auth_token_public_key",
        "auth_token_role_claim",
        "auth_token_audience",
        "broker_auth_token_file",
        "forward_auth_data",
        "auth_oidc_issuers",
        "auth_oidc_audiences",
        "auth_oidc_role_claim",
        "auth_oidc_leeway",
        "auth_oidc_allow_http",
        "auth_oidc_refresh",
        "auth_oidc_miss_refresh",
        "auth_oidc_ca",
        "broker_auth_oauth2_issuer",
        "broker_auth_oauth2_credentials",
        "broker_auth_oauth2_audience",
        "broker_auth_oauth2_scope",
        # message filters (for connections opened from then on)
        "filters",
        # TLS: the listeners' (a client CA, for the connections accepted
        # from then on) and Sluice's toward brokers (its client certificate,
        # for the connections it opens from then on)
        "tls",
        "broker_tls",
    }
)
# Of the recording settings, the snapshot rules (--snapshot-on) change live.
RECORD = "record"


# The LIVE settings that name a file a reload reads again. One whose file
# holds something else under the same name is a change, put in force like
# any other: a key rotated in place, or a Kubernetes Secret's file (which
# the kubelet replaces under its name), would otherwise look unchanged and
# leave the old key in force.
FILES = (
    "auth_token_secret_key",
    "auth_token_public_key",
    "broker_auth_token_file",
    "auth_oidc_ca",
    "broker_auth_oauth2_credentials",
    # (The listeners' own certificate and key are watched and taken as they
    # change, without a reload: dial.CertificateReloader.)
    "broker_tls.ca",
    "broker_tls.cert",
    "broker_tls.key",
    "tls.client_ca",
)


def files(config: Any, names: tuple[str, ...] = FILES) -> dict[str, Path | None]:
    """The files of settings ``names`` (of FILES; ``a.b``: field ``b`` of
    field ``a``) by setting; None where unset."""
    out: dict[str, Path | None] = {}
    for name in names:
        path = config
        for part in name.split("."):
            path = getattr(path, part, None)
        out[name] = path
    return out


def watched(config: Any) -> list[Path]:
    """The files whose change is a reload, besides the ``--config`` file:
    the ``SLUICE_DEFAULTS`` file (a layer of the settings below it, read
    again by a reload as the ``--config`` file is) and the files of FILES
    that ``config`` names; each once."""
    named = [defaults_path(), *files(config).values()]
    return list(dict.fromkeys(path for path in named if path is not None))


def held(config: Any, names: tuple[str, ...] = FILES) -> dict[str, str | None]:
    """What the files of settings ``names`` (of FILES) hold now: a SHA-256
    of each by setting; None where unset, "unreadable" where it cannot be
    read (loading it says why). Taken before the files are loaded, so that
    a file rewritten between the two reads as changed at the next reload."""
    out: dict[str, str | None] = {}
    for name, path in files(config, names).items():
        if path is None:
            out[name] = None
            continue
        try:
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            out[name] = "unreadable"
    return out


# ProxyConfig fields not named as their flag (``tls`` and ``broker_tls``
# stand for their flags by that prefix: --tls-cert, --broker-tls-ca, ...).
_FLAGS = {"admin_token": "--admin-token-file"}


def flag(name: str) -> str:
    """The command-line flag of a ProxyConfig field."""
    return _FLAGS.get(name) or "--" + name.replace("_", "-")


def flags(names: list[str]) -> list[str]:
    """The flags of ProxyConfig fields (``record``: the recorder's settings
    other than its snapshot rules, which ``split`` names ``snapshot_on``)."""
    return [flag(name) for name in names]


def split(
    old: Any,
    new: Any,
    was: dict[str, str | None] | None = None,
    now: dict[str, str | None] | None = None,
) -> tuple[list[str], list[str]]:
    """The fields of ``new`` (a ProxyConfig) that differ from ``old``: those
    a reload puts in force, and those it keeps as they were. ``was`` and
    ``now``: what the files of FILES held for ``old`` and hold for ``new``
    (``held``); a file that holds something else is a changed field."""
    live: list[str] = []
    kept: list[str] = []
    for f in dataclasses.fields(old):
        before, after = getattr(old, f.name), getattr(new, f.name)
        rewritten = (
            was is not None
            and now is not None
            and any(
                was.get(name) != now.get(name)
                for name in FILES
                if name == f.name or name.startswith(f.name + ".")
            )
        )
        if before == after and not rewritten:
            continue
        if f.name in LIVE:
            live.append(f.name)
        elif f.name == RECORD and before is not None and after is not None:
            # The snapshot rules change live where the flight recorder runs
            # (a ring: without one, they are kept with it, until a restart);
            # anything else of the recorder is kept.
            rules = after.triggers != before.triggers
            if dataclasses.replace(after, triggers=before.triggers) != before or (
                rules and not before.ring
            ):
                kept.append(f.name)
            if rules and before.ring:
                live.append("snapshot_on")
        else:
            kept.append(f.name)
    return live, kept


def effective(old: Any, new: Any, kept: list[str]) -> Any:
    """``new`` with the ``kept`` fields as they were in ``old``; the snapshot
    rules of ``new`` kept in the recorder settings of ``old`` where it has
    the ring they need (else they are kept as they were). ConfigError
    when that does not check out (a TLS listener kept whose certificate
    ``new`` drops), one line a mistake, naming what was kept."""
    changes = {name: getattr(old, name) for name in kept if name != RECORD}
    if RECORD in kept and old.record is not None and new.record is not None and old.record.ring:
        changes[RECORD] = dataclasses.replace(old.record, triggers=new.record.triggers)
    elif RECORD in kept:
        changes[RECORD] = old.record
    try:
        return dataclasses.replace(new, **changes)
    except ConfigError as exc:
        why = f"(kept as it was until a restart: {', '.join(flags(kept))})"
        lines = [f"{line} {why}" for line in str(exc).splitlines()]
        raise ConfigError("\n".join(lines)) from None


@dataclass
class Generation:
    """One configuration put in force."""

    number: int
    loaded_at: float  # wall clock
    source: str  # start, SIGHUP, file, admin

    def to_json(self) -> dict[str, Any]:
        return {
            "generation": self.number,
            "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.loaded_at)),
            "loaded_at_unix": round(self.loaded_at, 3),
            "source": self.source,
        }


@dataclass
class Outcome:
    """What a reload did: ``applied`` (a new generation), ``unchanged``
    (nothing live changed), or ``refused`` (``errors``, one line each)."""

    outcome: str
    generation: Generation
    changed: list[str] = field(default_factory=list)  # flags put in force
    kept: list[str] = field(default_factory=list)  # flags that need a restart
    errors: list[str] = field(default_factory=list)

    @classmethod
    def refused(cls, generation: Generation, source: str, errors: list[str]) -> Outcome:
        """A reload refused for ``errors`` (one line each); ``generation`` stays."""
        kept = Generation(generation.number, generation.loaded_at, source)
        return cls("refused", kept, errors=errors)

    @classmethod
    def unchanged(cls, generation: Generation, source: str, kept: list[str]) -> Outcome:
        """A reload that changed nothing live (``kept``: what needs a
        restart); ``generation`` stays, told as this reload's ``source``."""
        told = Generation(generation.number, generation.loaded_at, source)
        return cls("unchanged", told, kept=kept)

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            **self.generation.to_json(),
            "changed": self.changed,
            "kept": self.kept,
            "errors": self.errors,
        }

    def summary(self) -> str:
        """One line for the log."""
        parts = [f"configuration reload ({self.generation.source}): {self.outcome}"]
        if self.outcome == "applied":
            parts.append(f"generation {self.generation.number}: {', '.join(self.changed)}")
        if self.kept:
            parts.append(f"needs a restart, kept as it was: {', '.join(self.kept)}")
        if self.errors:
            parts.append("; ".join(self.errors))
        return "; ".join(parts)


async def read_again(load: Callable[[], Any]) -> tuple[Any, list[str]]:
    """The settings read again by ``load`` (in a thread: it reads files),
    or, when they cannot be, the lines that say why: a ConfigError's, or
    one for anything else reading them raised (a bug must refuse the
    reload, not end a running proxy)."""
    try:
        return await trio.to_thread.run_sync(load), []
    except ConfigError as exc:
        return None, str(exc).splitlines()
    except Exception as exc:
        logging.getLogger("sluice.proxy").debug("reading the settings again failed",
                                                exc_info=True)  # fmt: skip
        return None, [f"the settings could not be read again: {type(exc).__name__}: {exc}"]
