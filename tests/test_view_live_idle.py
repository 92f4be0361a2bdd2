"""``sluice view --live`` with no page open: it stops asking the proxy
(which then stops watching, and costs nothing), and starts again when a
page asks. A real ``sluice proxy`` on pulsar-lite; the view in-process."""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.view.live import LiveIndex, live_url, watch
from sluice.view.server import serve
from tests.helpers.poll import wait_until
from tests.helpers.support import start_proxy
from tests.test_view_live import TOKEN, ask

pytestmark = pytest.mark.e2e  # starts a proxy


def test_the_live_view_stops_asking_the_proxy_while_no_page_asks(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """The view asked the proxy for as long as it ran, page or no page: the
    proxy stayed watched (its relay 2 to 4 times dearer per message) with
    nobody looking. Now, with no page asking for ``page_gone`` seconds, it
    rests; a page asking starts it again."""
    (tmp_path / "token").write_text(TOKEN + "\n")
    admin = free_port()
    proxy = start_proxy(broker.url, tmp_path, "--admin", f"127.0.0.1:{admin}",
                        "--admin-token-file", str(tmp_path / "token"))  # fmt: skip
    index = LiveIndex(f"127.0.0.1:{admin}")
    server = serve(index, "127.0.0.1", 0, build=False)
    stop = threading.Event()
    args = (index, live_url(f"127.0.0.1:{admin}"), TOKEN, stop, 0.5)
    thread = threading.Thread(target=watch, args=args, daemon=True)
    try:
        thread.start()
        wait_until(lambda: index.asks >= 1, 5, "the view asks the proxy", step=0.05)
        wait_until(lambda: index.resting, 5, "the view rests, no page asking", step=0.05)
        asks = index.asks
        # The proxy answers another watcher meanwhile; the view still rests.
        assert [r["k"] for r in ask(admin, None)["unpacked"]] == ["header"]
        assert index.asks == asks and index.resting
        page = f"http://127.0.0.1:{server.server_address[1]}/api/status"
        with urllib.request.urlopen(page, timeout=10) as answer:
            assert answer.status == 200
        wait_until(lambda: not index.resting, 5, "the view asks again", step=0.05)
    finally:
        stop.set()
        thread.join(5)
        server.shutdown()
        server.server_close()
        proxy.kill()
