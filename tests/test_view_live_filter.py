"""``sluice view --live``'s page in Chromium (an in-process view over records
fed to it, no proxy): changing the filter while the page follows the newest
frames."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser

from sluice.recording.format import PayloadPolicy, header
from sluice.view.live import LiveIndex
from sluice.view.server import serve
from tests.test_view import browser, console_errors  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e  # a browser


def test_a_new_filter_shows_its_own_sequence_in_a_live_view(
    browser: Browser,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    """The page followed the newest 400 of 505 frames; a topic filter that
    matches 5 of them draws those 5 in the sequence diagram, as in the
    table, not 'no frames match' (the last offset kept for fewer frames)."""
    index = LiveIndex("127.0.0.1:9")
    records = [
        header(capture="live", segment=1, started_ns=0, payloads=PayloadPolicy.HASH,
               sluice_version="x", protocol="pulsar"),
        {"k": "conn", "c": 1, "t": 1, "w": 0, "client": "10.0.0.1:1", "broker": "b",
         "kind": "proxied", "listener": ""},
    ]  # fmt: skip
    for n in range(505):
        topic = "persistent://public/default/" + ("rare" if n < 5 else "busy")
        records.append({"k": "frame", "c": 1, "d": 0, "t": 10 + n, "w": 0, "n": 6, "raw": b"",
                        "s": {"cmd": "SEND", "topic": topic}})  # fmt: skip
    index.feed(records, 0, "1")
    server = serve(index, "127.0.0.1", 0, build=False, save_dir=tmp_path)
    page = browser.new_page()
    errors = console_errors(page)
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        page.wait_for_function(  # (following the newest: the last page, the last 400)
            "() => "
            "document.getElementById('where').textContent === '401\\u2013505 of 505' && document"
            ".querySelector('#sequence .hint')?.textContent.startsWith('frames 106\\u2013505')",
            timeout=4000,
        )
        page.fill("input[name=topic]", "rare")
        page.click("#filters button[type=submit]")
        page.wait_for_function("() => document.getElementById('count').textContent === '(5 match)'")
        page.wait_for_function(
            "() => document.getElementById('sequence-count').textContent === '(5 of 5 frames)'",
            timeout=2000,
        )
        assert page.locator("#sequence .arrow").count() == 5
    finally:
        page.close()
        server.shutdown()
        server.server_close()
    assert errors == []
