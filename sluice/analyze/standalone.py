"""Spark on 127.0.0.1 from PySpark's own distribution: a standalone cluster, a Spark Connect server.

A master and N workers started with PySpark's ``bin/spark-class`` (the
classes ``org.apache.spark.deploy.master.Master`` and ``…worker.Worker``),
each in its own process group, bound to loopback only, and stopped by
process id (SIGTERM, then SIGKILL), executors included. The tests and
``bench/analyze.py`` run ``sluice analyze --master spark://127.0.0.1:PORT``
against one; it is also a quick way to try a cluster by hand::

    python -m sluice.analyze.standalone --workers 2     # prints the URL, Ctrl-C stops it

:class:`ConnectServer` is a Spark Connect server (the class
``org.apache.spark.sql.connect.service.SparkConnectServer``, whose jar PySpark
ships) started with ``bin/spark-submit`` the same way, listening for gRPC on
127.0.0.1; ``sluice analyze --remote sc://127.0.0.1:PORT`` runs against it::

    python -m sluice.analyze.standalone --connect       # prints sc://…, Ctrl-C stops it
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

LOOPBACK = "127.0.0.1"
_MASTER_URL = re.compile(r"Starting Spark master at spark://[^:]+:(\d+)")
_MASTER_UI = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def loopback_env() -> dict[str, str]:
    """The environment for Spark processes (and drivers) that must stay on 127.0.0.1."""
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP=LOOPBACK,
        SPARK_LOCAL_HOSTNAME="localhost",
        PYSPARK_PYTHON=sys.executable,
        # No REST submission server (it would also bind a fixed port, 6066).
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
    )
    return env


class _Started:
    """Started on entering a ``with`` block, stopped on leaving it."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self, timeout: float = 20.0) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def stop_groups(processes: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM to each process's group (in this order), then wait for them
    all until ``timeout``, SIGKILL to a group whose leader did not exit, and
    to what is left in every group (executors, shells, Python workers)."""
    for process in processes:
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
        _signal_group(process.pid, signal.SIGKILL)


class StandaloneCluster(_Started):
    def __init__(self, workdir: Path, workers: int = 2, cores: int = 1, memory: str = "2g") -> None:
        self.workdir = workdir
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = 0
        self.ui_port = 0
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    def _spawn(self, name: str, *args: str) -> None:
        log = (self.workdir / f"{name}.log").open("wb")
        with log:
            self.processes.append(
                subprocess.Popen(
                    [str(spark_home() / "bin" / "spark-class"), *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=loopback_env(),
                    cwd=self.workdir,
                    start_new_session=True,  # its executors go with it
                )
            )

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        """Master first (ports chosen by the OS, read back from its log), then the workers."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        try:
            self._spawn(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host", LOOPBACK, "--port", "0", "--webui-port", "0",
            )  # fmt: skip
            self.port = int(self._wait_for_log("master", _MASTER_URL, deadline))
            self.ui_port = int(self._wait_for_log("master", _MASTER_UI, deadline))
            for n in range(self.workers):
                self._spawn(
                    f"worker{n}",
                    "org.apache.spark.deploy.worker.Worker",
                    "--host", LOOPBACK, "--port", "0", "--webui-port", "0",
                    "--cores", str(self.cores), "--memory", self.memory,
                    "--work-dir", str(self.workdir / f"worker{n}"),
                    self.url,
                )  # fmt: skip
            self._wait_for_workers(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _check_alive(self) -> None:
        dead = [p.args for p in self.processes if p.poll() is not None]
        if dead:
            raise RuntimeError(f"Spark process exited: {dead[0]!r}\n{self.logs()}")

    def _wait_for_log(self, name: str, pattern: re.Pattern[str], deadline: float) -> str:
        log = self.workdir / f"{name}.log"
        while time.monotonic() < deadline:
            self._check_alive()
            found = pattern.search(log.read_text(errors="replace"))
            if found:
                return found.group(1)
            time.sleep(0.2)
        raise RuntimeError(f"no {pattern.pattern!r} in {log}\n{self.logs()}")

    def _wait_for_workers(self, deadline: float) -> None:
        alive = 0
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(
                    f"http://{LOOPBACK}:{self.ui_port}/json/", timeout=2
                ) as answer:
                    alive = int(json.load(answer).get("aliveworkers", 0))
            except (OSError, urllib.error.URLError, ValueError):
                alive = 0
            if alive >= self.workers:
                return
            time.sleep(0.5)
        raise RuntimeError(f"{alive} of {self.workers} workers up in time\n{self.logs()}")

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}"
            for path in sorted(self.workdir.glob("*.log"))
        )

    def stop(self, timeout: float = 20.0) -> None:
        """Workers first, then the master."""
        stop_groups(list(reversed(self.processes)), timeout)
        self.processes.clear()


class ConnectServer(_Started):
    """A Spark Connect server on 127.0.0.1 whose own driver runs ``master``."""

    def __init__(self, workdir: Path, master: str = "local[2]", memory: str = "2g") -> None:
        self.workdir = workdir
        self.master = master
        self.memory = memory
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 120.0) -> ConnectServer:
        """Started, and answering on its port (a free one the OS picked)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with socket.socket() as probe:
            probe.bind((LOOPBACK, 0))
            self.port = probe.getsockname()[1]
        log = (self.workdir / "connect.log").open("wb")
        with log:
            self.process = subprocess.Popen(
                [
                    str(spark_home() / "bin" / "spark-submit"),
                    "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
                    "--name", "sluice-connect", "--master", self.master,
                    "--driver-memory", self.memory,
                    "--conf", f"spark.connect.grpc.binding.address={LOOPBACK}",
                    "--conf", f"spark.connect.grpc.binding.port={self.port}",
                    "--conf", "spark.ui.enabled=false",
                    "spark-internal",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=loopback_env(),
                cwd=self.workdir,
                start_new_session=True,  # its Python workers go with it
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the Spark Connect server exited\n{self.logs()}")
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection((LOOPBACK, self.port), timeout=1),
                ):
                    return self
                time.sleep(0.3)
            raise RuntimeError(f"the Spark Connect server did not listen in time\n{self.logs()}")
        except BaseException:
            self.stop()
            raise

    def logs(self, tail: int = 3000) -> str:
        return (self.workdir / "connect.log").read_text(errors="replace")[-tail:]

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is not None:
            stop_groups([self.process], timeout)
            self.process = None


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)  # the group this module created for that process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--dir", type=Path, default=Path("spark-standalone"))
    parser.add_argument(
        "--connect", action="store_true", help="a Spark Connect server (local[2]) instead"
    )
    args = parser.parse_args(argv)
    if args.connect:
        with ConnectServer(args.dir.resolve()) as server:
            print(f"{server.url}; Ctrl-C stops it")
            try:
                while server.process is not None and server.process.poll() is None:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        return 0
    with StandaloneCluster(args.dir.resolve(), args.workers, args.cores) as cluster:
        print(f"{cluster.url} (web UI http://{LOOPBACK}:{cluster.ui_port}); Ctrl-C stops it")
        try:
            while all(p.poll() is None for p in cluster.processes):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
