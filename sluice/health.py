"""The container image's HEALTHCHECK: ``python -m sluice.health [PID]``.

Healthy (exit 0) when the running ``sluice proxy`` answers: its admin
endpoint's ``/healthz``, asked where it listens (a wildcard address by
loopback), or, with the admin endpoint off, a connection to each of its
listeners. Otherwise exit 1, with one line on stderr.

It runs every 15 s beside a proxy that costs well under a millisecond of
CPU a second when idle, so the usual case stays cheap: the image's own
default (``admin`` in the ``SLUICE_DEFAULTS`` file) is asked first, with
the standard library alone (about 40 ms of CPU). Only when nothing
listens there (the admin endpoint moved or switched off by a flag, the
environment or a ``--config`` file) are the proxy's settings read again
as it read them: its command line, environment and working directory,
through the command line's own parser, which costs its import (about
0.3 s of CPU).

``PID``: the proxy's process (default: process 1, else the first ``sluice
proxy`` found), and no image default asked first.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

from sluice.addresses import is_wildcard


def near(host: str) -> str:
    """Where to reach a listener bound to ``host`` from inside its container:
    a wildcard (every interface) by loopback."""
    host = host.strip("[]")
    if not is_wildcard(host):
        return host
    return "::1" if ":" in host else "127.0.0.1"


class NothingThere(Exception):
    """Nothing listens at the address asked."""


def answers(host: str, port: int) -> bool:
    """Whether the admin endpoint at ``host``:``port`` answers ``/healthz``
    with 200; NothingThere when nothing listens there."""
    host = near(host)
    where = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(f"http://{where}:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:  # answered, not 200 (503: not healthy)
        return False
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            raise NothingThere(f"nothing listens at {where}:{port}") from None
        raise


def image_default() -> tuple[str, int] | None:
    """``admin`` in the ``SLUICE_DEFAULTS`` file (the image's), if any."""
    path = os.environ.get("SLUICE_DEFAULTS")
    if not path:
        return None
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError):
        return None
    table = data.get("proxy")
    admin = table.get("admin") if isinstance(table, dict) else None
    admin = data.get("admin") if admin is None else admin
    if not isinstance(admin, str) or ":" not in admin:
        return None
    host, _, port = admin.rpartition(":")
    return (host, int(port)) if port.isdigit() else None


def proxy_command(pid: str) -> list[str] | None:
    """The words after ``sluice`` on process ``pid``'s command line, if it
    runs ``sluice proxy`` (its console script, or ``python -m sluice``)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    words = raw.decode(errors="surrogateescape").split("\0")[:-1]
    at = next((i for i, w in enumerate(words) if i and os.path.basename(w) == "sluice"), None)
    argv = words[at + 1 :] if at else []
    return argv if next((a for a in argv if not a.startswith("-")), "") == "proxy" else None


def settings_of(pid: str, argv: list[str]) -> argparse.Namespace:
    """Process ``pid``'s settings read again as it read them: its flags,
    its environment, its files from its working directory."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="surrogateescape")
    environ = dict(entry.split("=", 1) for entry in raw.split("\0") if "=" in entry)
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(f"/proc/{pid}/cwd")
    from sluice.commands import parse_again  # (the costly import: only now)

    return parse_again(argv)


def check(pid: str, argv: list[str]) -> str | None:
    """None when the proxy of process ``pid`` (command line ``argv``) is
    healthy, else why not."""
    from sluice.commands.proxy import checked_config

    config = checked_config(settings_of(pid, argv))
    if config.admin is not None:
        healthy = answers(config.admin.host, config.admin.port)
        return None if healthy else f"the admin endpoint at {config.admin} is not healthy"
    for listener in (config.listen, config.listen_tls):
        if listener is not None:
            socket.create_connection((near(listener.host), listener.port), timeout=2).close()
    return None


def main(argv: list[str]) -> int:
    why: str | None
    try:
        why = _why_not(argv)
    except Exception as exc:  # (unhealthy, said in one line)
        why = str(exc) or type(exc).__name__
    if why is not None:
        print(f"sluice.health: {why}", file=sys.stderr)
        return 1
    return 0


def _why_not(argv: list[str]) -> str | None:
    default = None if argv else image_default()
    if default is not None:
        try:
            return None if answers(*default) else f"the admin endpoint at {default} is not healthy"
        except NothingThere:
            pass  # moved or off: asked where the proxy's own settings say
    pids = argv or ["1", *sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int)]
    found = next(((pid, command) for pid in pids if (command := proxy_command(pid))), None)
    if found is None:  # the image runs another command (demo, inspect): nothing to ask
        return "no `sluice proxy` process" if argv else None
    return check(*found)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
