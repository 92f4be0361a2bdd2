"""``sluice view`` over a capture of many connections (a day of lookups):
the page shows a bounded number of them, in a real headless Chromium,
served in-process."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from sluice.recording import format as fmt
from sluice.view.index import Index
from sluice.view.server import serve

pytestmark = pytest.mark.e2e  # starts Chromium

CONNECTIONS = 3000


@pytest.fixture
def many(tmp_path: Path) -> Iterator[str]:
    """A capture of CONNECTIONS lookup connections, a LOOKUP on each, served."""
    t0, w0 = time.monotonic_ns(), time.time_ns()
    records: list[fmt.Record] = [
        fmt.header(capture="c1", segment=1, started_ns=w0, payloads=fmt.PayloadPolicy.HASH,
                   sluice_version="x", protocol="pulsar"),
    ]  # fmt: skip
    for c in range(CONNECTIONS):
        t = t0 + c * 1_000_000
        records += [
            {"k": "conn", "c": c, "t": t, "w": w0, "client": f"10.0.{c // 250}.{c % 250}:5000",
             "broker": "b:6650", "kind": "lookup", "listener": "plain"},
            {"k": "frame", "c": c, "d": 0, "t": t + 10, "w": w0, "n": 10, "raw": b"",
             "s": {"cmd": "LOOKUP", "topic": f"persistent://p/n/t{c}", "rid": 1}},
            {"k": "close", "c": c, "t": t + 20, "w": w0, "reason": "done"},
        ]  # fmt: skip
    (tmp_path / "a.sluice").write_bytes(fmt.dumps(records))
    index = Index(tmp_path)
    index.build()
    assert index.frames == CONNECTIONS and not index.error
    server = serve(index, "127.0.0.1", 0, build=False)
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_a_capture_of_many_connections_shows_a_bounded_page(many: str) -> None:
    """3,000 connections were 3,000 table rows, select options and timeline
    lanes (100,000 took the page minutes); now at most 500 rows and 200
    lanes, each said as "of" how many, and a frame on a connection beyond
    them still named by its own connection."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium is not None, "chromium is not installed"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(many)
            page.wait_for_function(
                "() => document.querySelector('#summary').textContent.length > 0"
            )
            assert page.locator("#connections tbody tr").count() == 500
            assert page.locator("#connections-count").text_content() == f"(500 of {CONNECTIONS})"
            assert page.locator("select[name=conn] option").count() == 1 + 500
            lanes = page.locator("#timeline svg text.lane").all_text_contents()
            assert lanes == [f"c{c}" for c in range(200)]
            assert f"lanes for 200 of the {CONNECTIONS} connections" in (
                page.locator("#timeline .hint").first.text_content() or ""
            )
            last = CONNECTIONS - 1
            page.goto(f"{many}#conn={last}")
            page.reload()
            page.wait_for_function(
                "() => "
                "document.querySelector('#frames tbody tr td:nth-child(3)')?.textContent"
                f" === 'c{last}'"
            )
            assert page.locator("#frames tbody tr").count() == 1
            assert page.locator("#timeline svg text.lane").all_text_contents() == [f"c{last}"]
            assert page.locator("select[name=conn]").input_value() == str(last)
        finally:
            browser.close()
