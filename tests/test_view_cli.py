"""`sluice view` on the command line, run in-process: what it refuses before it serves."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sluice.commands import main


@pytest.mark.parametrize(
    ("live", "said"),
    [
        ("ftp://127.0.0.1:9090", "expected HOST:PORT or http://HOST:PORT"),
        ("http://127.0.0.1:port", "expected HOST:PORT or http://HOST:PORT"),
        ("http://127.0.0.1:9090/?x=1", "expected HOST:PORT or http://HOST:PORT"),
        ("http://a b:9090", "URL can't contain control characters"),
        ("http://a%00b:9090", "URL can't contain control characters"),
        ("localhost", "expected HOST:PORT"),
        ("localhost:99999", "port 99999 is out of range"),
    ],
)
def test_a_live_address_that_is_not_one_is_refused_before_serving(
    live: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--live used to take anything: the page then served, and the watching
    failed where only the page said so (or its thread died with a
    traceback), the command line printing where to look and nothing else."""
    token = tmp_path / "token"
    token.write_text("a-token\n")
    argv = ["view", "--live", live, "--admin-token-file", str(token), "--listen", "127.0.0.1:0"]
    codes: list[int] = []
    # In a thread: a view that does serve would serve until Ctrl-C.
    thread = threading.Thread(target=lambda: codes.append(main(argv)), daemon=True)
    thread.start()
    thread.join(10)
    assert codes == [2], "the view started serving"
    err = capsys.readouterr().err
    assert err.startswith(f"sluice view: --live {live!r}: ") and said in err, err
    assert err.count("\n") == 1, err


CAPTURE = (Path(__file__).resolve().parent / "golden" / "analyze" / "inputs"
           / "sluice-20261128T172608-f2b453b65503-0001.sluice")  # fmt: skip


def test_an_export_of_no_frames_is_refused_not_misreported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-frames 0 wrote the first frame and said 'wrote ...: 0 of 50'."""
    out = tmp_path / "x.html"
    assert main(["view", str(CAPTURE), "--export", str(out), "--max-frames", "0"]) == 2
    assert capsys.readouterr().err == "sluice view: --max-frames must be at least 1\n"
    assert not out.exists()
    assert main(["view", str(CAPTURE), "--export", str(out), "--max-frames", "1"]) == 0
    assert "wrote " + str(out) + ": 1 of 50 matching frames" in capsys.readouterr().err
