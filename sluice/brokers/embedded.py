"""The embedded ``pulsar-lite`` broker: one process on a loopback port.

Used by ``sluice demo``, the test suite, the golden-vector capture script and
the benchmarks. We run the broker binary that the ``pulsar-lite`` wheel ships
directly (not its Python helper, which shares processes between callers), so
each broker is ours to stop, by PID, when we are done.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType


class BrokerError(RuntimeError):
    """The embedded broker could not be found or started."""


def os_error(what: str, path: str | Path, exc: OSError) -> BrokerError:
    """One line for a broker's start that the file system refused: what was
    being done, the path it failed on (the error's own where it names one:
    a directory above ``path``, the ``cwd`` of a process), and why."""
    where = exc.filename if exc.filename is not None else path
    if isinstance(exc, FileExistsError):
        cause = "exists and is not a directory"
    else:
        cause = exc.strerror or str(exc)
    return BrokerError(f"cannot {what} {os.fsdecode(where)}: {cause}")


def settings_written(data_dir: Path, write: Callable[[], Path]) -> Path:
    """``data_dir`` made and a broker's settings written there (``write``:
    the file's path); what the file system refused, one line."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error("create the broker's data directory", data_dir, exc) from None
    try:
        return write()
    except OSError as exc:
        raise os_error("write the broker's settings", data_dir, exc) from None


def broker_binary() -> Path:
    """Path of the ``pulsar-lite`` executable inside its wheel."""
    try:
        import pulsar_lite
    except ImportError as exc:
        raise BrokerError(
            "the embedded broker needs the pulsar-lite package: pip install pulsar-lite"
        ) from exc
    path = Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite"
    if not path.is_file():
        raise BrokerError(f"pulsar-lite is installed but its broker binary is missing: {path}")
    return path


_LOWEST = 10000  # below: well-known and registered services
_PICK = random.SystemRandom()  # not the module's generator, which tests seed alike


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody uses right now, for a process that binds it later.

    Drawn at random from below the range the kernel gives outgoing
    connections their local ports from: a port in that range could be taken
    meanwhile by any connection (another test worker's clients, a busy
    host's), and the later bind would fail. The kernel picks one when that
    range cannot be read or leaves no room below it.

    Drawn strictly (no SO_REUSEADDR): a port in TIME_WAIT is passed over,
    which costs one more draw, so that a port drawn is bindable by any
    process it is meant for, one that binds without SO_REUSEADDR too.
    Whether a port is *taken* (``_in_use``) is asked as the broker binds."""
    low = _ephemeral_low()
    if low is not None and low - _LOWEST >= 1000:
        for _ in range(64):
            port = _PICK.randrange(_LOWEST, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue  # in use (or in TIME_WAIT): another
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int | None:
    """The lowest local port the kernel gives outgoing connections (Linux)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _listens(pid: int, port: int) -> bool | None:
    """Whether ``pid`` or a process below it holds a listening TCP socket on
    ``port``; None where /proc cannot tell."""
    try:
        children: dict[int, list[int]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    stat = Path(entry.path, "stat").read_text()
                    children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(
                        int(entry.name)
                    )
        inodes: set[str] = set()
        tree = [pid]
        while tree:
            here = tree.pop()
            tree.extend(children.get(here, ()))
            with contextlib.suppress(OSError):
                for fd in os.scandir(f"/proc/{here}/fd"):
                    with contextlib.suppress(OSError):
                        target = os.readlink(fd.path)
                        if target.startswith("socket:["):
                            inodes.add(target[8:-1])
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(FileNotFoundError), open(table) as rows:
                next(rows)  # the column names
                for row in rows:
                    fields = row.split()  # sl, local, remote, state, ..., inode (10th)
                    if (fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port
                            and fields[9] in inodes):  # fmt: skip
                        return True
    except OSError:
        return None
    return False


def _in_use(host: str, port: int) -> bool:
    """Whether another socket holds ``port`` on ``host`` (bound now). Bound
    as pulsar-lite binds its port (SO_REUSEADDR): a port whose connections
    wait in TIME_WAIT (a previous run's, the broker's own after a start that
    failed) is one the broker can listen on, not another process's."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


# How many ports a broker is started on before its start is given up, when
# each drawn port is taken before the broker binds it.
_DRAWS = 3


def terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``; reaped.
    Interrupted while it waits (a second Ctrl-C or SIGTERM while a JVM takes
    its seconds to stop), it kills the process before it lets the interrupt
    on: whoever stops it has already let go of it, so nobody else would."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    except BaseException:
        process.kill()
        process.wait()
        raise


def wait_for_port(host: str, port: int, timeout: float, process: subprocess.Popen[bytes]) -> None:
    """Until ``process`` listens on ``port``: a connection there succeeds and,
    where /proc tells (Linux), the listening socket is the process's or one
    of its children's, not another's that took the port ``free_port`` drew
    before ``process`` could bind it."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise BrokerError(f"broker exited with status {process.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                if _listens(process.pid, port) is not False:
                    return
            raise OSError("the port is another process's")
        except OSError:
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"broker did not listen on {host}:{port} within {timeout}s"
                ) from None
            time.sleep(0.05)


class EmbeddedBroker:
    """A ``pulsar-lite`` broker process.

    ``with EmbeddedBroker() as broker: broker.url`` starts it on a free
    loopback port with a scratch data directory, and stops it (SIGTERM, then
    SIGKILL) and removes the directory on exit.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        data_dir: str | Path | None = None,
        *,
        default_partitions: int | None = None,
        max_message_size: int | None = None,
        log_path: str | Path | None = None,
        start_timeout: float = 15.0,
        settings: dict[str, int | str | bool] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        """``die_with_parent``: the broker is sent SIGTERM by the kernel when
        the thread that started it ends (Linux), should this process die
        without stopping it (SIGKILL): for a command's broker (``sluice
        demo``), not for one a thread starts and leaves to others."""
        self.host = host
        self._own_port = not port  # drawn here: drawn again if taken meanwhile
        self.port = port or free_port(host)
        self._own_dir = data_dir is None
        try:
            self.data_dir = (
                Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="sluice-broker-"))
            )
        except OSError as exc:  # (no usable temporary directory: the error names none)
            raise os_error("create the broker's data directory", "in $TMPDIR", exc) from None
        self.default_partitions = default_partitions
        self.max_message_size = max_message_size
        self.log_path = Path(log_path) if log_path else self.data_dir / "broker.log"
        self.start_timeout = start_timeout
        # Any other pulsar-lite setting, e.g. {"keep_alive_interval_secs": 300}.
        self.settings = dict(settings or {})
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"pulsar://{self.host}:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def _config(self) -> Path:
        lines = ['log_level = "info"']
        if self.default_partitions is not None:
            lines.append(f"default_partitions = {int(self.default_partitions)}")
        if self.max_message_size is not None:
            lines.append(f"max_message_size_bytes = {int(self.max_message_size)}")
        for key, value in self.settings.items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, int):
                lines.append(f"{key} = {value}")
            else:
                lines.append(f'{key} = "{value}"')
        # Its own metrics endpoint, on 0.0.0.0:8080 unless told: nobody here
        # reads it, and a demo's or a test's broker listens on loopback only
        # (and leaves a port 8080 the user's own services may want).
        lines += ["[metrics]", "enabled = false"]
        path = self.data_dir / "pulsar-lite.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it listens. However that ends
        otherwise (BrokerError, Ctrl-C while it comes up), the broker is
        stopped and a data directory of its own removed."""
        if self.process is not None:
            raise BrokerError("broker already started")
        try:
            for draws in range(_DRAWS, 0, -1):
                try:
                    return self._start()
                except BrokerError:
                    # The port drawn free was bound by another process before
                    # the broker could: another one (a port asked for is
                    # the caller's, and said taken).
                    if not self._own_port or draws == 1 or not _in_use(self.host, self.port):
                        raise
                    self.port = free_port(self.host)
            raise AssertionError("unreachable")
        except BaseException:
            self.stop()
            raise

    def _start(self) -> EmbeddedBroker:
        binary = broker_binary()
        config = settings_written(self.data_dir, self._config)
        try:
            log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        except OSError as exc:
            raise os_error("open the broker's log", self.log_path, exc) from None
        try:
            self.process = subprocess.Popen(
                [
                    str(binary),
                    "--config",
                    str(config),
                    "--addr",
                    f"{self.host}:{self.port}",
                    "--db-path",
                    str(self.data_dir / "db"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.data_dir,
                preexec_fn=die_with(os.getpid()) if self.die_with_parent else None,
                env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
            )
        except OSError as exc:  # not executable, not a program, a data dir it cannot enter
            raise os_error("run the broker", binary, exc) from None
        finally:
            log.close()
        try:
            wait_for_port(self.host, self.port, self.start_timeout, self.process)
        except BrokerError as exc:
            tail = self.log_tail()  # before stop(), which removes a data dir of its own
            process, self.process = self.process, None
            terminate(process, 5.0)
            raise BrokerError(f"{exc}\n{tail}" if tail else str(exc)) from None
        return self

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        process, self.process = self.process, None
        if process is not None:
            terminate(process, timeout)
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn``: the child is sent SIGTERM when ``parent`` (the
    thread that forked it) ends; None where there is no prctl (not Linux)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arrange() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return arrange
