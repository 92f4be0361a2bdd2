"""SIGHUP while ``sluice proxy`` starts: held, not fatal.

Once the proxy serves, SIGHUP asks for a configuration reload
(``server.reload_when_asked``). Until that handler is installed, SIGHUP's
default action would end the process, and a configuration-management tool
that sends a reload right after it started the proxy (or a terminal's
hangup while it starts) would kill it. So the process notes a SIGHUP from
as early as it can (``hold``, before the heavy imports: ``python -m
sluice``, and the ``sluice`` script's first import,
``sluice/commands/__init__.py``), and the reload handler, once it
takes over, carries out one reload for whatever came before (``take``):
the settings read at start may predate the change the signal was sent for.

A worker of ``--workers`` ignores SIGHUP from its first line instead
(``WORKER_COMMAND``): its reloads are written by the supervisor, and it
catches up with the one written while it started once it can take them.

This module imports nothing but the standard library's ``signal`` and is
cheap to import: it must run before everything else."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

# A worker process of --workers: SIGHUP ignored before anything is imported
# (the default action would end it while Python loads the proxy), then the
# worker's main (sluice/proxy/workers.py).
WORKER_COMMAND = [
    sys.executable,
    "-c",
    "import signal; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
    "from sluice.proxy.workers import main; raise SystemExit(main())",
]

_asked = False


def _note(signum: int, frame: FrameType | None) -> None:
    global _asked
    _asked = True


def hold() -> None:
    """From now on, a SIGHUP is noted for the reload handler to take, not
    the end of the process. Only where SIGHUP has its default action (a
    process started under ``nohup`` ignores it already) and in the main
    thread (the only one that may set a handler)."""
    try:
        if signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:
            signal.signal(signal.SIGHUP, _note)
    except ValueError:  # not the main thread: the caller's handlers are its own
        pass


def hold_for(argv: list[str]) -> None:
    """``hold()`` when the command line ``argv`` (without the program) runs
    ``sluice proxy``; other commands keep SIGHUP's default action."""
    command = next((word for word in argv if not word.startswith("-")), None)
    if command == "proxy":
        hold()


def hold_for_script() -> None:
    """``hold_for`` this process's command line, when it is the ``sluice``
    script's (not a program that imports Sluice, whose signals are its own)."""
    if sys.argv and os.path.basename(sys.argv[0]) == "sluice":
        hold_for(sys.argv[1:])


def take() -> bool:
    """Whether a SIGHUP was noted since ``hold()`` (or the last ``take``);
    forgotten once told."""
    global _asked
    asked, _asked = _asked, False
    return asked
