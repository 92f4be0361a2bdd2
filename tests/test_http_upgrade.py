"""An ``Upgrade`` to another protocol than WebSocket (``h2c``, which curl
``--http2`` and Java's HttpClient offer on ``http://`` URLs) is declined
by answering over HTTP/1.1, as RFC 9110 7.8 lets a server, and as the
broker's own web server does: the request is served, and the upgrade and
the headers its ``Connection`` names do not go on. Sluice's HTTP listener
in process, in front of a web service of the test's own on loopback.
"""

from __future__ import annotations

import subprocess

import pytest
import trio

from tests.test_http_relay import Upstream, exchange, ok, relay

H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"


async def test_an_h2c_upgrade_is_declined_and_the_request_served() -> None:
    upstream = Upstream(ok(b'["standalone"]'))
    async with relay(upstream) as (_, port):
        got = await exchange(
            port,
            b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\n" + H2C + b"\r\n"
            b"PUT /admin/v2/tenants/t HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            + H2C + b"\r\n{}",
        )  # fmt: skip
    # Both answered, on the one connection, over HTTP/1.1.
    assert got.count(b'HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n["standalone"]') == 2, got
    assert b"101" not in got.split(b"\r\n", 1)[0]
    assert len(upstream.heads) == 2 and upstream.bodies[1] == b"{}"
    for index in (0, 1):
        names = {name for name, _ in upstream.headers(index)}
        assert not names & {b"upgrade", b"http2-settings", b"connection"}, upstream.heads


@pytest.mark.e2e  # runs curl
async def test_curl_http2_on_an_http_url_gets_its_answer() -> None:
    upstream = Upstream(ok(b'["standalone"]'))
    async with relay(upstream) as (_, port):
        done = await trio.to_thread.run_sync(
            lambda: subprocess.run(
                ["curl", "-sS", "--http2", "--max-time", "4",
                 "-w", "\n%{http_code} %{http_version}",
                 f"http://127.0.0.1:{port}/admin/v2/clusters"],
                capture_output=True, text=True, check=False,
            )
        )  # fmt: skip
    assert done.stdout == '["standalone"]\n200 1.1', (done.stdout, done.stderr)
    assert b"upgrade: h2c" not in upstream.heads[0].lower()
