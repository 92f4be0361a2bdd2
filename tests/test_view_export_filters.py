"""``sluice view --export``: the exported page's filters answer as the
server's do, in a real headless Chromium (the file opened from disk)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from sluice.view.index import Filter, HttpFilter, Index
from sluice.view.server import export
from tests.test_view_index import capture, frame

pytestmark = pytest.mark.e2e  # starts Chromium


def test_an_exported_page_filters_by_producer_and_consumer(tmp_path: Path) -> None:
    """The exported page showed no frame at all for a producer or consumer
    filter (its rows did not carry them); it shows those the server's own
    filter gives."""
    records = [
        frame(0, "SEND", topic="t", pid=1, seq=0),
        frame(1, "SEND_RECEIPT", topic="t", pid=1, seq=0),
        frame(2, "SEND", topic="t", pid=2, seq=0),
        frame(3, "FLOW", topic="t", cid=5),
        frame(5, "MESSAGE", topic="t", cid=5),
        frame(7, "MESSAGE", topic="t", cid=6),
    ]
    index = Index(capture(tmp_path / "c", records))
    index.build()
    exported = tmp_path / "export.html"
    exported.write_text(export(index, Filter(), 100, 10))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium is not None, "chromium is not installed"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            for query, want in (("producer=1", 2), ("producer=2", 1), ("consumer=5", 2),
                                ("consumer=6", 1), ("producer=3", 0)):  # fmt: skip
                key, _, value = query.partition("=")
                server = index.page(Filter.from_query({key: value}), 0, 100)["rows"]
                assert len(server) == want, query
                page.goto(f"{exported.as_uri()}#{query}")
                page.reload()
                page.wait_for_function(
                    "(want) => document.getElementById('count').textContent === `(${want} match)`",
                    arg=want,
                    timeout=5000,
                )
                shown = page.locator("#frames tbody tr td:first-child").all_inner_texts()
                assert shown == [str(r["i"]) for r in server], query
        finally:
            browser.close()


def test_an_exported_page_filters_http_exchanges_as_the_server_does(tmp_path: Path) -> None:
    """A status class typed in capitals (``4XX``), or a path with a space
    around it: the server's filter takes them (trimmed, in either case), the
    exported page's matched nothing."""
    t0, w0 = time.monotonic_ns(), time.time_ns()
    records = [
        {"k": "http", "h": n, "x": 1, "t": t0 + n * 1000, "w": w0, "te": t0 + n * 1000 + 10,
         "status": status, "client": "10.0.0.1:1", "method": "GET", "path": path,
         "kind": "admin"}
        for n, (status, path) in enumerate(
            [(200, "/admin/v2/clusters"), (404, "/admin/v2/nope"), (403, "/lookup/v2/x")]
        )
    ]  # fmt: skip
    index = Index(capture(tmp_path / "c", records))
    index.build()
    assert not index.error, index.error
    exported = tmp_path / "export.html"
    exported.write_text(export(index, Filter(), 100, 10))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium is not None, "chromium is not installed"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(exported.as_uri())
            page.wait_for_function("() => !document.getElementById('http').hidden")
            for path, status in (("", "4XX"), (" /admin/ ", ""), ("/admin/", " 4xx ")):
                query = {"path": path, "status": status}
                want = index.http_page(HttpFilter.from_query(query), 0, 100)["rows"]
                page.fill("#http-filters input[name=path]", path)
                page.fill("#http-filters input[name=status]", status)
                page.click("#http-filters button[type=submit]")
                page.wait_for_function(
                    "(n) => document.getElementById('http-count').textContent === `(${n} match)`",
                    arg=len(want),
                    timeout=5000,
                )
                shown = page.locator("#exchanges tbody tr td:first-child").all_inner_texts()
                assert shown == [str(e["i"]) for e in want] and want, query
        finally:
            browser.close()
