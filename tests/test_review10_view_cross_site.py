"""Review: another site's page can ask a live view's API (by its IP address).

The viewer refuses a ``Host`` that is another site's name (DNS rebinding),
but a page on any site may still send requests to
``http://127.0.0.1:8088/api/...`` (``fetch(url, {mode: "no-cors"})``, an
``<img>``): the answer is not readable there, yet each one was served, and
in a live view each keeps the view watching (``asked_now``), so the proxy
kept sending every relayed frame through its slow path for as long as that
page stayed open, the operator's own page long closed. Browsers say whose
page a request comes from (``Sec-Fetch-Site``): a request to ``/api/`` from
another site's page is refused (403) now; the page's own requests, tools
that send no such header (curl) and a link followed from another site to
the page itself are served as before.
"""

from __future__ import annotations

import http.client

import pytest

from sluice.recording.format import PayloadPolicy, header
from sluice.view.live import LiveIndex
from sluice.view.server import serve


def _get(port: int, path: str, headers: dict[str, str]) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path, headers=headers)
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


@pytest.mark.e2e  # a socket on loopback
def test_another_sites_page_cannot_keep_a_live_view_watching() -> None:
    index = LiveIndex("127.0.0.1:9")
    index.feed([
        header(capture="live", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
               sluice_version="x", protocol="pulsar"),
    ])  # fmt: skip
    server = serve(index, "127.0.0.1", 0, build=False)
    port = int(server.server_address[1])
    own = {"Host": f"127.0.0.1:{port}"}
    try:
        for site in ("cross-site", "same-site"):
            index.asked = 0.0
            status = _get(port, "/api/status",
                          {**own, "Sec-Fetch-Site": site, "Sec-Fetch-Mode": "no-cors"})  # fmt: skip
            assert status == 403, site
            assert index.asked == 0.0, f"a {site} request kept the live view watching"
        # The page's own requests, curl, and a link to the page from elsewhere.
        for headers, path in (
            ({"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}, "/api/status"),
            ({}, "/api/status"),
            ({"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}, "/"),
            ({"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"}, "/"),
        ):
            index.asked = 0.0
            assert _get(port, path, {**own, **headers}) == 200, (headers, path)
            assert path == "/" or index.asked > 0.0
    finally:
        server.shutdown()
        server.server_close()
