"""The official client's log lines (the C++ client's ConsoleLogger writes
them to stdout) landed in ``sluice demo``'s stdout, mixed into the demo's
own output (its report, which a user pipes or saves): after an
interrupted run, with the client left behind on a broker that answers
nothing, its connection errors came out there. They go where the demo's
diagnostics go (stderr), said as the client's; stdout stays the demo's."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.poll import wait_for_text
from tests.helpers.support import gone

# A line of the C++ client's log:
# "2026-12-07 17:41:59.661 ERROR [1406...] ClientConnection:485 | ..."
CLIENT_LINE = re.compile(r"\d\d:\d\d:\d\d\.\d+ (ERROR|WARN|INFO) \[\d+\] \w+:\d+ \|")


@pytest.mark.e2e  # runs the demo and its broker
def test_the_clients_errors_stay_out_of_the_demos_stdout(tmp_path: Path) -> None:
    err, out = tmp_path / "stderr", tmp_path / "stdout"
    with open(err, "wb") as stderr, open(out, "wb") as stdout:
        demo = subprocess.Popen(
            [sys.executable, "-m", "sluice", "demo", "--messages", "20000",
             "--record", str(tmp_path / "rec")],
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
        )  # fmt: skip
    broker = 0
    try:
        wait_for_text(demo, err, "one by one", 60, "the one-by-one sends")
        line = next(x for x in err.read_text().splitlines() if "(embedded pulsar-lite, pid" in x)
        broker = int(line.rsplit("pid ", 1)[1].rstrip(")"))
        os.kill(broker, signal.SIGSTOP)  # a broker that answers nothing any more
        time.sleep(0.5)  # the client's sends now wait for it (not a state polled)
        demo.send_signal(signal.SIGTERM)
        status = demo.wait(timeout=60)
        said = err.read_text()
        assert status == 128 + signal.SIGTERM, said[-2000:]
        assert out.read_text() == "", "stdout: " + out.read_text()[-2000:]
        client = [x for x in said.splitlines() if CLIENT_LINE.search(x)]
        assert client, "the client's errors were not said: " + said[-2000:]
        assert all(x.startswith("[client] ") for x in client), said[-2000:]
        assert gone(broker), "the broker was left"
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        if broker:
            for signum in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(broker, signum)
                except ProcessLookupError:
                    break


def test_the_client_log_is_said_once_complete_lines_at_most_a_screenful(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sluice.commands.demo import ClientLog

    log = ClientLog()
    said: list[str] = []
    assert log.path is not None
    try:
        log.path.write_text("".join(f"line {i}\n" for i in range(ClientLog.SHOWN + 3)) + "part")
        log.forward(said.append)
        first = capsys.readouterr()
        assert first.out == ""
        assert first.err.splitlines() == [f"[client] line {i}" for i in range(ClientLog.SHOWN)]
        assert said == ["the client logged 3 more line(s), not shown"]
        with open(log.path, "a") as more:
            more.write("ial\n")
        log.close(said.append)
        assert capsys.readouterr().err == "[client] partial\n"
    finally:
        log.close()
    assert not log.path.exists()


def test_no_temporary_file_to_be_had_is_no_log_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tempfile

    from sluice.commands.demo import ClientLog

    def refused(*args: object, **kwargs: object) -> tuple[int, str]:
        raise FileNotFoundError("No usable temporary directory found")

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    log = ClientLog()
    assert log.path is None
    log.forward()
    log.close()
    assert capsys.readouterr().err == ""
