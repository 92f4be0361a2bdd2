"""``sluice view``: what the page and its server give away, and to whom,
in-process (no proxy)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sluice.commands import main
from sluice.recording.format import PayloadPolicy, header
from sluice.view.live import LiveIndex
from sluice.view.server import serve


def test_a_live_view_is_not_served_to_the_network(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Watching needs the proxy's admin token; a live view listening on
    0.0.0.0 handed what it watched (topics, properties, payloads) to anyone
    on the network, who needs no token to ask the page. It is refused, in
    one line, before anything listens; loopback is served as before."""
    index = LiveIndex("127.0.0.1:9")
    index.feed([
        header(capture="live", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
               sluice_version="x", protocol="pulsar"),
    ])  # fmt: skip
    for host in ("0.0.0.0", "::", "192.0.2.1", "view.example"):
        with pytest.raises(PermissionError) as refused:
            serve(index, host, 0, build=False)
        assert "loopback only" in str(refused.value.strerror), host
    for host in ("127.0.0.1", "localhost"):
        server = serve(index, host, 0, build=False)
        server.shutdown()
        server.server_close()
    token = tmp_path / "token"
    token.write_text("a-token\n")
    argv = ["view", "--live", "127.0.0.1:9", "--admin-token-file", str(token),
            "--listen", "0.0.0.0:0", "--save-dir", str(tmp_path)]  # fmt: skip
    codes: list[int] = []
    # In a thread: a view that does serve would serve until Ctrl-C.
    thread = threading.Thread(target=lambda: codes.append(main(argv)), daemon=True)
    thread.start()
    thread.join(10)
    assert codes == [1], "the live view served on 0.0.0.0"
    err = capsys.readouterr().err
    assert err.startswith("sluice view: cannot listen on 0.0.0.0:0: a live view is served on "
                          "loopback only"), err  # fmt: skip
    assert err.count("\n") == 1, err
