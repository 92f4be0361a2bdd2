"""The package as users install it: the wheel built with ``python -m build``
from a copy of the source, installed with pip into a fresh virtual
environment without extras, and its ``sluice`` command used there.

Nothing here imports the checkout's ``sluice`` in that environment: the
commands run with the environment's own interpreter, from a directory that
holds no source. pulsar-lite and the official client come from the
project's environment (the test extra), as in the other tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker, free_port, wait_for_port
from sluice.extras import EXTRAS
from tests.helpers.support import ProxyProcess, client

ROOT = Path(__file__).resolve().parent.parent
# Commands that need an extra, and which: each must say so in one line when
# it is missing. (The test below fails when an extra is added to
# sluice.extras.EXTRAS without its command here.)
NEEDS_EXTRA = {"demo": "demo", "analyze": "pipeline"}
# Building and installing fetch from PyPI: slow on a loaded machine, bounded.
INSTALL_TIMEOUT = 900
# A capture recorded with --record-payloads hash (33 frames on 2 connections,
# topics analyzed-a and analyzed-b): the commands that read captures run on a
# copy of it.
GOLDEN = ROOT / "tests/golden/analyze/inputs/sluice-20261128T172607-bf2cfe0d70e7-0001.sluice"


@dataclass
class Installed:
    """A fresh virtual environment with the wheel installed, no extras."""

    root: Path
    wheel: Path
    work: Path  # a directory without source: the commands' working directory

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def sluice_command(self) -> str:
        return str(self.root / "bin" / "sluice")

    def env(self) -> dict[str, str]:
        """The environment of a user's shell with the venv activated."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.root)
        return env

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``sluice ARGS...`` as a user in the activated venv runs it."""
        return self.execute([self.sluice_command, *args], timeout)

    def python_code(self, code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.execute([self.python, "-c", code], timeout)

    def execute(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False, cwd=self.work, env=self.env())  # fmt: skip


def one_line(result: subprocess.CompletedProcess[str], status: int) -> str:
    """The one line a command that refuses says on stderr (no traceback)."""
    assert result.returncode == status, (result.args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, (result.args, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, (result.args, result.stderr)
    return lines[0]


def _checked(command: list[str], what: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT,
                          check=False, cwd=cwd, env=env)  # fmt: skip
    assert done.returncode == 0, f"{what} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def source_copy(into: Path) -> Path:
    """The files of the checkout that git tracks or would track (not what
    .gitignore names: no .venv, no build outputs), copied to ``into``: the
    wheel is built from these alone, and nothing stale from an earlier build
    (a ``sluice/_frames*.so``, ``build/``) gets into it. (Cargo's cache is
    the one thing shared with the checkout: see ``installed``.)"""
    git = shutil.which("git")
    assert git, "git is needed to list the source files"
    listed = subprocess.run(
        [git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    for name in listed.stdout.decode().split("\0"):
        source = ROOT / name
        if name and source.is_file():  # a file deleted but not yet staged is skipped
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """Built and installed once per test session.

    The wheel is built from a copy of the source (``source_copy``), but cargo
    builds the Rust crate in the checkout's ``rust/target`` (or in the
    ``CARGO_TARGET_DIR`` already set), where ``./dev setup``'s editable
    install built it with the same profile and features: the crate's
    dependencies (pyo3 and the rest) are reused, not compiled again, about a
    minute of every session. That is safe: cargo keys what it keeps there on
    each unit's sources (and their files' times), profile, features and
    compiler, and rebuilds what differs, as for a build in the checkout
    itself (the copy keeps the checkout's file times: a source changed since
    that build is newer than it, and compiled again); it locks the directory
    while it builds. (Absent, cargo makes it.) The directory is one git
    ignores; nothing else of the build is written into the checkout."""
    base = tmp_path_factory.mktemp("install")
    source = source_copy(base / "source")
    dist = base / "dist"
    env = {**os.environ}
    env.setdefault("CARGO_TARGET_DIR", str(ROOT / "rust" / "target"))
    # `build` from the project's environment; the build backend (whatever
    # pyproject.toml names) is fetched into an isolated environment.
    _checked([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)],
             "python -m build --wheel", cwd=base, env=env)  # fmt: skip
    wheels = list(dist.glob("sluice-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {dist}: {wheels}"
    root = base / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    _checked([str(root / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
              "--no-input", "-q", str(wheels[0])], "pip install WHEEL", cwd=base)  # fmt: skip
    work = base / "work"
    work.mkdir()
    yield Installed(root, wheels[0], work)


def test_the_installed_package_is_the_wheel_and_has_no_extras(installed: Installed) -> None:
    where = installed.python_code(
        "import importlib.util, json, sluice; "
        "print(json.dumps([sluice.__file__, {m: importlib.util.find_spec(m) is not None "
        f"for m in {sorted(m for _, mods in EXTRAS.values() for m in mods)!r}}}]))"
    )
    assert where.returncode == 0, where.stderr
    path, found = json.loads(where.stdout)
    # The wheel's copy, not the checkout's.
    assert Path(path).is_relative_to(installed.root), path
    assert not any(found.values()), f"an extra's module is installed: {found}"
    # The extras the commands name are the ones pyproject.toml declares.
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(EXTRAS) <= set(declared["optional-dependencies"])
    assert set(NEEDS_EXTRA.values()) == set(EXTRAS)


def test_version(installed: Installed) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    result = installed.run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"sluice {version}"


def test_every_module_imports_or_names_a_missing_extra(installed: Installed) -> None:
    """Every import of the runtime package is a declared dependency; a module
    that needs an extra's package is one that only commands needing that
    extra import (checked with their --help and their run below)."""
    script = """
import importlib, json, pkgutil, sluice
out = {}
for info in pkgutil.walk_packages(sluice.__path__, "sluice."):
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as exc:
        out[info.name] = exc.name
print(json.dumps(out))
"""
    result = installed.python_code(script, timeout=300)
    assert result.returncode == 0, result.stderr
    extra_modules = {m: extra for extra, (_, mods) in EXTRAS.items() for m in mods}
    failures = json.loads(result.stdout)
    undeclared = {module: missing for module, missing in failures.items()
                  if missing.split(".")[0] not in extra_modules}  # fmt: skip
    assert not undeclared, f"modules importing undeclared packages: {undeclared}"


def commands(installed: Installed) -> list[list[str]]:
    """Every command and subcommand, as the installed parser has them."""
    script = """
import json
from sluice.commands import _subparsers, build_parser
def walk(parser, path):
    for name, sub in _subparsers(parser).items():
        yield [*path, name]
        yield from walk(sub, [*path, name])
print(json.dumps(list(walk(build_parser(), []))))
"""
    result = installed.python_code(script)
    assert result.returncode == 0, result.stderr
    found: list[list[str]] = json.loads(result.stdout)
    return found


def test_every_command_has_help(installed: Installed) -> None:
    found = commands(installed)
    names = {path[0] for path in found}
    assert {"proxy", "inspect", "view", "replay", "serve", "faults", "record"} | set(
        NEEDS_EXTRA
    ) <= names, names
    for path in found:
        result = installed.run(*path, "--help")
        assert result.returncode == 0, (path, result.stderr)
        assert f"usage: sluice {' '.join(path)}" in result.stdout, (path, result.stdout)
        assert "Traceback" not in result.stderr, (path, result.stderr)


def test_a_missing_extra_is_one_line_naming_it(installed: Installed, tmp_path: Path) -> None:
    recording = tmp_path / "recording"
    recording.mkdir()
    arguments = {
        "demo": ["--messages", "2"],
        "analyze": [str(recording), "--out", str(tmp_path / "analysis")],
    }
    assert set(arguments) == set(NEEDS_EXTRA)
    for command, extra in NEEDS_EXTRA.items():
        result = installed.run(command, *arguments[command])
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert len(lines) == 1, (command, result.stderr)
        assert lines[0].startswith(f"sluice {command} needs "), lines
        assert lines[0].endswith(f"pip install 'sluice[{extra}]'"), lines
        assert result.stdout == "", (command, result.stdout)
    assert not (tmp_path / "analysis").exists()


def test_proxy_records_and_the_recording_reads_back(
    installed: Installed, broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    """A user's first session: the proxy in front of a broker, one message
    produced and consumed through it, then inspect and view on the recording."""
    record = tmp_path / "recording"
    port = free_port()
    log_path = tmp_path / "proxy.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [installed.sluice_command, "proxy", "--broker", broker.url,
             "--listen", f"127.0.0.1:{port}", "--record", str(record),
             "--record-payloads", "full"],
            stdout=log, stderr=subprocess.STDOUT, cwd=installed.work, env=installed.env(),
        )  # fmt: skip
    proxy = ProxyProcess(process, port, log_path)
    try:
        wait_for_port("127.0.0.1", port, 30, process)
        with client(proxy.url) as c:
            consumer = c.subscribe(topic, "install-test")
            c.create_producer(topic).send(b"installed as users install it")
            message = consumer.receive(timeout_millis=15_000)
            consumer.acknowledge(message)
        assert message.data() == b"installed as users install it"
        assert proxy.terminate() == 0, proxy.log()  # SIGTERM: drained, recording closed
    finally:
        proxy.kill()
    assert "Traceback" not in proxy.log(), proxy.log()
    assert list(record.rglob("*.sluice")), proxy.log()

    inspected = installed.run("inspect", str(record))
    assert inspected.returncode == 0, inspected.stderr
    for needed in ("CONNECT", "PRODUCER", "SEND", "SUBSCRIBE", "MESSAGE", "ACK", topic):
        assert needed in inspected.stdout, (needed, inspected.stdout[-3000:])
    summary = installed.run("inspect", str(record), "--summary")
    assert summary.returncode == 0 and "SEND" in summary.stdout, summary.stderr

    page = tmp_path / "recording.html"
    viewed = installed.run("view", str(record), "--export", str(page))
    assert viewed.returncode == 0, viewed.stderr
    assert f"wrote {page}" in viewed.stderr and "Traceback" not in viewed.stderr, viewed.stderr
    html = page.read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and topic in html

    # The recording kept its payloads: serve answers as the broker did, and
    # replaying the clients against it finds the same exchange.
    serve_port = free_port()
    serve_log = tmp_path / "serve.log"
    with open(serve_log, "wb") as log:
        process = subprocess.Popen(
            [installed.sluice_command, "serve", str(record), "--listen", f"127.0.0.1:{serve_port}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=installed.work, env=installed.env(),
        )  # fmt: skip
    served = ProxyProcess(process, serve_port, serve_log)
    try:
        wait_for_port("127.0.0.1", serve_port, 30, process)
        replayed = installed.run("replay", str(record), "--broker", served.url, "--quiet")
        assert replayed.returncode == 0, (replayed.stdout, replayed.stderr, served.log())
        assert "equivalent" in replayed.stdout, replayed.stdout
        assert served.terminate() == 0, served.log()
    finally:
        served.kill()
    assert "Traceback" not in served.log(), served.log()


def test_the_installed_package_holds_every_file_of_the_source(installed: Installed) -> None:
    """What the commands read at run time (the view's page, the pinned Apache
    Pulsar's files, the schema module) is in the installed package, and the
    frame path is the compiled extension: every file git tracks under
    sluice/ is installed, data files included."""
    where = installed.python_code(
        "import importlib.util, json, sluice; "
        "print(json.dumps([sluice.__path__[0], importlib.util.find_spec('sluice._frames').origin]))"
    )
    assert where.returncode == 0, where.stderr
    package, frames = (Path(p) for p in json.loads(where.stdout))
    assert package.is_relative_to(installed.root), package
    assert frames.parent == package and frames.suffix == ".so", frames
    git = shutil.which("git")
    assert git, "git is needed to list the source files"
    tracked = subprocess.run([git, "ls-files", "-z", "sluice"], cwd=ROOT, capture_output=True,
                             check=True, timeout=60).stdout.decode().split("\0")  # fmt: skip
    names = [name for name in tracked if name and (ROOT / name).is_file()]
    assert "sluice/view/static/app.js" in names and "sluice/brokers/apache-pulsar/pom.xml" in names
    missing = [name for name in names if not (package.parent / name).is_file()]
    assert not missing, f"in the source but not in the installed package: {missing}"
    checked = installed.execute([installed.python, "-m", "pip", "check"], 120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    module = installed.execute([installed.python, "-m", "sluice", "--version"], 60)
    assert module.returncode == 0 and module.stdout.startswith("sluice "), module.stderr


def golden_capture(into: Path) -> Path:
    capture = into / "capture"
    capture.mkdir()
    shutil.copy2(GOLDEN, capture)
    return capture


def test_inspect_and_anonymize_a_capture(installed: Installed, tmp_path: Path) -> None:
    capture = golden_capture(tmp_path)
    lines = installed.run("inspect", str(capture), "--json")
    assert lines.returncode == 0, lines.stderr
    records = [json.loads(line) for line in lines.stdout.splitlines()]
    assert sum(r["kind"] == "frame" for r in records) == 33, records[:3]
    pcap = tmp_path / "capture.pcapng"
    wrote = installed.run("inspect", str(capture), "--pcap", str(pcap))
    assert wrote.returncode == 0, wrote.stderr
    assert pcap.read_bytes()[:4] == b"\x0a\x0d\x0d\x0a"  # a pcapng section header

    anonymized = tmp_path / "anonymized"
    done = installed.run("record", "anonymize", str(capture), str(anonymized),
                         "--key-file", str(tmp_path / "key"))  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    original = installed.run("inspect", str(capture)).stdout
    copy = installed.run("inspect", str(anonymized))
    assert copy.returncode == 0, copy.stderr
    assert "analyzed-a" in original and "analyzed-a" not in copy.stdout, copy.stdout[-2000:]
    assert copy.stdout.count("CONNECT ") == original.count("CONNECT ") > 0


def test_commands_with_nothing_to_talk_to(installed: Installed, tmp_path: Path) -> None:
    """replay, serve, proxy --print-config and the admin commands with no
    broker or proxy: output, or one line, never a traceback."""
    capture = golden_capture(tmp_path)
    # Replaying and serving need payloads: this capture has none.
    nowhere = f"127.0.0.1:{free_port()}"
    for command in (["replay", str(capture), "--broker", f"pulsar://{nowhere}"],
                    ["serve", str(capture), "--listen", nowhere]):  # fmt: skip
        line = one_line(installed.run(*command), 2)
        assert line.startswith(f"sluice {command[0]}: ") and "--record-payloads full" in line

    config = installed.run("proxy", "--broker", f"pulsar://{nowhere}", "--print-config")
    assert config.returncode == 0, config.stderr
    assert f'broker = "pulsar://{nowhere}"  # flag' in config.stdout, config.stdout

    for command in (["faults", "list"], ["faults", "add", "--drop"], ["record", "snapshot"]):
        line = one_line(installed.run(*command, "--admin", nowhere), 1)
        assert line.startswith(f"sluice {' '.join(command[:2])}: cannot reach the admin"), line


def test_proxy_runs_without_its_broker_and_stops(installed: Installed, tmp_path: Path) -> None:
    """--no-check-broker in front of a port nothing listens on: the proxy
    listens, says it is not ready, and SIGTERM stops it cleanly."""
    port, admin = free_port(), free_port()
    log_path = tmp_path / "proxy.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [installed.sluice_command, "proxy", "--broker", f"pulsar://127.0.0.1:{free_port()}",
             "--no-check-broker", "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=installed.work, env=installed.env(),
        )  # fmt: skip
    proxy = ProxyProcess(process, port, log_path)
    try:
        wait_for_port("127.0.0.1", admin, 30, process)
        wait_for_port("127.0.0.1", port, 30, process)
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/healthz", timeout=10) as answer:
            assert answer.status == 200
        # Not ready: first while the broker is not yet checked, then because
        # the check found nothing there.
        deadline = time.monotonic() + 30
        reason = ""
        while "unreachable" not in reason and time.monotonic() < deadline:
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=10)
            assert refused.value.code == 503
            reason = refused.value.read().decode()
            time.sleep(0.05)
        assert "unreachable" in reason, reason
        assert proxy.terminate() == 0, proxy.log()
    finally:
        proxy.kill()
    assert "upstream broker unreachable" in proxy.log() and "Traceback" not in proxy.log()
