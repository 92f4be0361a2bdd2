"""The container image's Dockerfile, read as text (building it needs a
container engine: `./dev image`)."""

from __future__ import annotations

import http.server
import re
import socket
import threading
from pathlib import Path

import pytest

from sluice import health

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def test_the_default_base_is_the_debian_release_dev_image_builds_on() -> None:
    """`./dev image` builds and runs the image on Debian bookworm; the
    Dockerfile's default base names that release, not a tag (python:3.11-slim)
    that moves to Debian's next release on its own."""
    (base,) = re.findall(r"^ARG BASE=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    (tested,) = re.findall(r'^BASE_IMAGE="[^"]*:(\w+)"$', (ROOT / "dev").read_text(), re.MULTILINE)
    assert tested == "bookworm"
    assert re.fullmatch(rf"python:3\.11(\.\d+)?-slim-{tested}(@sha256:[0-9a-f]{{64}})?", base), base


def _healthy(admin: str) -> bool:
    """Whether the HEALTHCHECK's ask (sluice.health) of an admin endpoint
    listening at ``admin`` (HOST:PORT, as --admin takes it) says healthy."""
    host, _, port = admin.rpartition(":")
    try:
        return health.answers(host, int(port))
    except (health.NothingThere, OSError):
        return False


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "::1"])
def test_the_healthcheck_asks_where_the_admin_endpoint_listens(host: str) -> None:
    """The HEALTHCHECK asked 127.0.0.1:9090 whatever SLUICE_ADMIN said:
    another port (or an address that is not loopback) made a healthy
    container 'unhealthy', and Docker's restart policies act on that. A
    wildcard is asked by loopback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(http.server.ThreadingHTTPServer):
        address_family = family

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = Server((host, 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        assert _healthy(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    finally:
        server.shutdown()
        server.server_close()
    assert not _healthy(f"127.0.0.1:{port}")  # nothing there now
