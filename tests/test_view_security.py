"""``sluice view``: what the page and its server give away, and to whom,
and what the page runs; in-process (no proxy), the page in Chromium."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from sluice.commands import main
from sluice.recording.format import PayloadPolicy, header
from sluice.view.index import Filter, Index
from sluice.view.live import LiveIndex
from sluice.view.server import export, serve
from tests.test_view import console_errors
from tests.test_view_index import capture, frame


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


# An inline handler (what a recorded name that got past escaping into the
# page would be): whether it ran.
INJECTED = """() => new Promise((done) => {
  const html = '<img id="injected" src="data:," onerror="window.pwned = 1">';
  document.body.insertAdjacentHTML("beforeend", html);
  document.getElementById("injected").addEventListener(
    "error", () => setTimeout(() => done(window.pwned === 1), 0));
})"""


@pytest.mark.e2e  # starts Chromium
def test_the_page_runs_no_inline_script_served_or_exported(tmp_path: Path) -> None:
    """The page escapes what it shows; should a recorded string get past
    that, the page's policy runs nothing of it (no inline handler, no
    script from elsewhere) and the exported file reaches no network. The
    page itself works under it: frames, timeline, sequence, summary, with
    nothing refused."""
    records = [frame(n, "SEND", topic="persistent://p/n/t", pid=0, seq=n) for n in range(4)]
    index = Index(capture(tmp_path / "c", records))
    index.build()
    server = serve(index, "127.0.0.1", 0, build=False)
    exported = tmp_path / "export.html"
    exported.write_text(export(index, Filter(), 100, 10))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium is not None, "chromium is not installed"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                for url in (f"http://127.0.0.1:{server.server_address[1]}/",
                            exported.as_uri()):  # fmt: skip
                    page = browser.new_page()
                    errors = console_errors(page)
                    page.goto(url)
                    page.wait_for_function("() => document.querySelector('#summary').textContent")
                    assert page.locator("#frames tbody tr").count() == 4, url
                    assert page.locator("#sequence g.arrow").count() == 4, url
                    assert page.locator("#timeline svg rect").count() >= 4, url
                    assert errors == [], (url, errors)
                    assert page.evaluate(INJECTED) is False, url
                    page.close()
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
