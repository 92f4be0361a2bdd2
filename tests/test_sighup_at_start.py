"""SIGHUP while ``sluice proxy`` starts (a configuration-management tool
that sends a reload right after it started the proxy): the process takes it
from before it loads the proxy's code, and carries the reload out once it
serves; it was SIGHUP's default action, the end of the process, until the
reload handler was installed, once the proxy listened. With ``--workers``,
the supervisor alike, and each worker ignores it from its first line (it
takes reloads from the supervisor, catching up once it can)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.brokers.embedded import free_port
from sluice.proxy import hangup

SLUICE = [sys.executable, "-m", "sluice"]
# The most a step may take on a loaded machine (each test takes under two
# seconds unloaded).
TIMEOUT = 20.0


def _heavy() -> list[str]:
    """Files of compiled modules the proxy loads with its code (trio loads
    ssl): none is loaded before ``hangup.hold``."""
    import _ssl

    import sluice._frames

    found = [getattr(module, "__file__", None) for module in (_ssl, sluice._frames)]
    return [name for name in found if name]


HEAVY = _heavy()


def test_the_markers_of_the_proxys_code_are_files() -> None:
    """What the tests below look for in a process's memory map is there to
    find: at least one of them is a shared library of this interpreter."""
    assert HEAVY and all(Path(name).is_file() for name in HEAVY)


def _takes_sighup(pid: int) -> bool | None:
    """Whether ``pid`` catches or ignores SIGHUP (its default action ends
    it); None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    bit = 1 << (signal.SIGHUP - 1)
    masks = dict(re.findall(r"^(SigIgn|SigCgt):\s*([0-9a-f]+)$", status, re.MULTILINE))
    return any(int(masks[name], 16) & bit for name in ("SigIgn", "SigCgt"))


def _loaded(pid: int) -> list[str]:
    """Which of ``HEAVY`` process ``pid`` has mapped."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [name for name in HEAVY if os.path.realpath(name) in maps or name in maps]


def _serving(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def _first_sighup(pid: int, deadline: float, log: Path) -> list[str]:
    """Wait until ``pid`` takes SIGHUP; which of ``HEAVY`` it had loaded
    just before (looked at first: the test is late to look, never early)."""
    while True:
        loaded = _loaded(pid)
        taken = _takes_sighup(pid)
        assert taken is not None, f"process {pid} ended while starting:\n{log.read_text()}"
        if taken:
            return loaded
        assert time.monotonic() < deadline, f"process {pid} never took SIGHUP"
        time.sleep(0.0005)


def _workers(pid: int) -> Iterator[int]:
    """The worker processes of supervisor ``pid`` (once they run a worker's
    command: until then, a child is a copy of the supervisor)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"sluice.proxy.workers" in command:
            yield int(stat.parent.name)


def _wait_for(what: str, ready: object, deadline: float, proxy: subprocess.Popen[bytes]) -> None:
    assert callable(ready)
    while not ready():
        assert proxy.poll() is None, f"the proxy ended ({proxy.returncode}) waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {TIMEOUT}s"
        time.sleep(0.01)


# The installed script, beside the interpreter (hold_for_script: its name).
SCRIPT = [str(Path(sys.executable).with_name("sluice"))]


def _start(
    tmp_path: Path, *extra: str, launcher: list[str] = SLUICE
) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    log = tmp_path / "proxy.log"
    with log.open("wb") as out:
        proxy = subprocess.Popen(
            [*launcher, "proxy", "--listen", f"127.0.0.1:{port}", "--no-check-broker",
             "--broker", f"pulsar://127.0.0.1:{free_port()}",
             "--drain-timeout", "1", *extra],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return proxy, port, log


def _sighup_at_once(proxy: subprocess.Popen[bytes], port: int, deadline: float, log: Path) -> None:
    """SIGHUP to the proxy as soon as it takes one: before it loaded its
    code, and before it serves."""
    loaded = _first_sighup(proxy.pid, deadline, log)
    early = not _serving(port)
    os.kill(proxy.pid, signal.SIGHUP)
    assert early, "SIGHUP ended the proxy (its default action) until the proxy served"
    assert loaded == [], f"SIGHUP ended the proxy until it had loaded {loaded}"


@pytest.mark.e2e
@pytest.mark.parametrize("launcher", [SLUICE, SCRIPT], ids=["python -m sluice", "sluice"])
def test_a_sighup_while_the_proxy_starts_is_a_reload_once_it_serves(
    tmp_path: Path, launcher: list[str]
) -> None:
    deadline = time.monotonic() + TIMEOUT
    proxy, port, log = _start(tmp_path, launcher=launcher)
    try:
        _sighup_at_once(proxy, port, deadline, log)
        _wait_for("listener", lambda: _serving(port), deadline, proxy)
        _wait_for("reload", lambda: "configuration reload (SIGHUP)" in log.read_text(),
                  deadline, proxy)  # fmt: skip
        assert "SIGHUP came while starting: reloading now" in log.read_text()
        assert proxy.poll() is None
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(TIMEOUT) == 0, log.read_text()
    finally:
        if proxy.poll() is None:
            proxy.kill()
            proxy.wait()


@pytest.mark.e2e
def test_with_workers_a_sighup_while_they_start_ends_none(tmp_path: Path) -> None:
    """The supervisor as a lone proxy; each worker takes SIGHUP before it
    loads the proxy's code (it did once it had, a few tenths of a second
    into its start: a SIGHUP to the proxy's process group then, as a
    terminal's hangup, killed it, and it was restarted)."""
    deadline = time.monotonic() + TIMEOUT
    proxy, port, log = _start(tmp_path, "--workers", "2")
    try:
        _sighup_at_once(proxy, port, deadline, log)
        signalled: set[int] = set()
        while len(signalled) < 2:
            for pid in set(_workers(proxy.pid)) - signalled:
                loaded = _first_sighup(pid, deadline, log)
                os.kill(pid, signal.SIGHUP)
                assert loaded == [], f"SIGHUP ended a worker until it had loaded {loaded}"
                signalled.add(pid)
            assert proxy.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"workers started: {signalled}"
            time.sleep(0.0005)

        def ready() -> set[int]:
            return {int(p) for p in re.findall(r"worker \d \(pid (\d+)\) ready", log.read_text())}

        _wait_for("two workers", lambda: len(ready()) >= 2, deadline, proxy)
        assert ready() == signalled, log.read_text()  # none was restarted
        assert "exited" not in log.read_text()
        _wait_for("reload", lambda: "configuration reload (SIGHUP)" in log.read_text(),
                  deadline, proxy)  # fmt: skip
        assert _serving(port)
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(TIMEOUT) == 0, log.read_text()
    finally:
        if proxy.poll() is None:
            proxy.kill()
            proxy.wait()


@pytest.fixture
def sighup_restored() -> Iterator[None]:
    before = signal.getsignal(signal.SIGHUP)
    hangup.take()
    yield
    signal.signal(signal.SIGHUP, before)
    hangup.take()


def test_only_the_proxy_command_holds_sighup(sighup_restored: None) -> None:
    """Another command (``sluice view`` in a terminal that closes) keeps
    SIGHUP's default action: it ends it."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    hangup.hold_for(["inspect", "proxy.sluice"])
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    hangup.hold_for(["--version"])
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    hangup.hold_for(["proxy", "--broker", "pulsar://b:6650"])
    assert signal.getsignal(signal.SIGHUP) != signal.SIG_DFL


def test_a_held_sighup_is_taken_once(sighup_restored: None) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    hangup.hold()
    assert not hangup.take()
    os.kill(os.getpid(), signal.SIGHUP)
    os.kill(os.getpid(), signal.SIGHUP)
    deadline = time.monotonic() + 2
    while not hangup.take():  # (a handler runs between two bytecodes of the main thread)
        assert time.monotonic() < deadline
    assert not hangup.take()


def test_sighup_left_ignored_stays_ignored(sighup_restored: None) -> None:
    """Under ``nohup`` (SIGHUP ignored), holding changes nothing."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    hangup.hold()
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def test_the_sluice_script_holds_sighup_for_proxy_alone(
    sighup_restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sluice/commands/proxy.py`` holds SIGHUP as it is imported, for the
    ``sluice`` script's ``proxy`` command only: not in a program that
    imports Sluice (this test run), nor for another command."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    monkeypatch.setattr(sys, "argv", ["/usr/bin/pytest", "proxy"])
    hangup.hold_for_script()
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    monkeypatch.setattr(sys, "argv", ["/venv/bin/sluice", "view", "x.sluice"])
    hangup.hold_for_script()
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    monkeypatch.setattr(sys, "argv", ["/venv/bin/sluice", "proxy", "--workers", "2"])
    hangup.hold_for_script()
    assert signal.getsignal(signal.SIGHUP) != signal.SIG_DFL
