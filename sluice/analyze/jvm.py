"""The driver JVM ``sluice analyze`` starts: which ``java`` runs it, and the
class cache that makes it start in about half the time.

A local Spark's driver loads some 15,000 classes before its first job,
and does so again on every run: on two cores that is 6 to 10 s of a
small job's 15 to 25. Java's class-data sharing keeps those classes,
parsed and verified, in an archive the next JVM maps instead
(``-XX:SharedArchiveFile``). The second run with no archive has its JVM
write one as it exits (``-XX:ArchiveClassesAtExit``, 150-200 MB, several
seconds more at the end of that run); every later run maps it. The first
run only leaves a mark: a run whose cache folder does not outlive it (a
fresh container, a CI job) never pays for an archive no run would map.

The archive is made under a name of this run's own and put in place only
after its JVM exited cleanly: a JVM that maps a partly written archive
dies (SIGBUS), so a half-written one must never carry the name later runs
map. Its name is keyed on the ``java`` binary, the PySpark release and
its jars: another Java or Spark makes (and then uses) an archive of its
own, and the JVM itself checks an archive against its build and class
path and runs without one it cannot use (``-Xshare:auto``; its messages
about that are turned off). ``SLUICE_SPARK_CLASS_CACHE=off`` turns the
cache off; ``SLUICE_CACHE_DIR`` (else ``XDG_CACHE_HOME``) moves it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sluice.config import cache_dir

log = logging.getLogger("sluice.analyze")

OFF = "SLUICE_SPARK_CLASS_CACHE"
# The JVM's own lines about an archive it cannot use (or while writing one,
# about classes it leaves out) are not the user's business.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
KEPT = 3  # archives kept (one per Java and Spark used lately), ~150 MB each
STALE_PART_S = 3600.0  # a part older than this was left by a run that died
EXIT_WAIT_S = 120.0  # how long a run waits for its JVM to write the archive


def spark_java(env: Mapping[str, str]) -> str | None:
    """The ``java`` PySpark's launcher runs (``$JAVA_HOME/bin/java`` when
    JAVA_HOME is set, else ``java`` on PATH), or None where there is none."""
    home = env.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        return java if os.access(java, os.X_OK) else None
    return shutil.which("java", path=env.get("PATH", ""))


@dataclass(frozen=True)
class ClassCache:
    """This run's archive: ``archive`` is mapped when it exists; else this
    run's JVM writes ``making`` as it exits, put in place by :meth:`keep`."""

    archive: Path
    making: Path | None

    def java_options(self) -> str:
        if self.making is not None:
            return f"-XX:ArchiveClassesAtExit={self.making} {QUIET}"
        return f"-XX:SharedArchiveFile={self.archive} -Xshare:auto {QUIET}"

    def keep(self, jvm: subprocess.Popen[bytes] | None) -> bool:
        """After the session stopped: let the JVM exit (it writes the
        archive then) and put what it wrote in place. Whether it did."""
        if self.making is None or jvm is None:
            return False
        try:
            if jvm.stdin is not None:
                jvm.stdin.close()  # the gateway's JVM exits when its stdin ends
            code = jvm.wait(timeout=EXIT_WAIT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.debug("the JVM did not exit to write its class cache: %r", exc)
            return False
        try:
            if code != 0 or self.making.stat().st_size == 0:
                log.debug("no class cache kept: the JVM exited %s", code)
                self.making.unlink(missing_ok=True)
                return False
            os.replace(self.making, self.archive)
        except OSError as exc:
            log.debug("no class cache kept: %r", exc)
            return False
        return True


def class_cache(env: Mapping[str, str]) -> ClassCache | None:
    """The class cache for a driver JVM this process starts; None when it is
    turned off, under ``spark-submit`` (the JVM runs already), or where its
    folder cannot be written."""
    if env.get(OFF, "").strip().lower() in ("off", "0", "no", "false"):
        return None
    if "PYSPARK_GATEWAY_PORT" in env:
        return None
    java = spark_java(env)
    if java is None:
        return None
    try:
        import pyspark

        home = Path(env.get("SPARK_HOME") or Path(pyspark.__file__).parent)
        real = Path(java).resolve()
        seen = real.stat()
        jars = sorted(p.name for p in (home / "jars").glob("*.jar"))
        key = hashlib.sha256(
            "\n".join([str(real), str(seen.st_mtime_ns), str(seen.st_size),
                       pyspark.__version__, str(home.resolve()), *jars]).encode()
        ).hexdigest()[:16]  # fmt: skip
        folder = cache_dir(env) / "spark"
        folder.mkdir(parents=True, exist_ok=True)
    except (ImportError, OSError) as exc:
        log.debug("no class cache: %r", exc)
        return None
    if any(c.isspace() or c in "'\"\\" for c in str(folder)):
        return None  # Spark splits the JVM's options on spaces (and quotes)
    archive = folder / f"driver-{key}.jsa"
    if archive.is_file():
        with contextlib.suppress(OSError):
            os.utime(archive)  # used: the last to go (see _tidy)
        return ClassCache(archive, None)
    mark = folder / f"driver-{key}.seen"
    if not mark.exists():
        # A first run only says it ran: where the cache folder does not
        # outlive the run (a fresh container, a CI job), writing an archive
        # no run will map would only cost that run its seconds.
        with contextlib.suppress(OSError):
            mark.touch()
        return None
    _tidy(folder)
    return ClassCache(archive, folder / f"driver-{key}.{os.getpid()}.part")


def _tidy(folder: Path) -> None:
    """Before making an archive: the archives of other Javas or Sparks but
    the ``KEPT - 1`` used last, and parts a dead run left."""
    now = time.time()
    with contextlib.suppress(OSError):
        archives = sorted(folder.glob("driver-*.jsa"), key=lambda p: p.stat().st_mtime)
        for old in archives[: max(0, len(archives) - (KEPT - 1))]:
            old.unlink(missing_ok=True)
    for part in folder.glob("driver-*.part"):
        with contextlib.suppress(OSError):
            if now - part.stat().st_mtime > STALE_PART_S:
                part.unlink()
