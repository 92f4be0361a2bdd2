"""What the admin endpoint shows to anyone and what needs its token, as
docs/reliability.md lists it: every request in that list is made against a
real proxy, without the token and with it."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

from sluice.brokers.embedded import EmbeddedBroker, free_port
from tests.helpers.support import client, start_proxy, wait_ready

ROOT = Path(__file__).resolve().parent.parent.parent
TOKEN = "admin-token-for-the-listed-requests"
BODIES = {
    "POST /faults": {"match": {"command": "PING"}, "action": "delay", "delay_ms": 1},
    "POST /recording/snapshot": {"reason": "listed"},
    "POST /live": {},
}


def documented() -> list[tuple[str, str, bool]]:
    """(method, path, token needed) for each request docs/reliability.md lists."""
    text = (ROOT / "docs" / "reliability.md").read_text()
    section = text.split("\n## The admin endpoint\n", 1)[1].split("\n## ", 1)[0]
    listed = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1] in ("yes", "no"):
            for method, path in re.findall(r"`([A-Z]+) (/[^`]*)`", cells[0]):
                listed.append((method, path, cells[1] == "yes"))
    return listed


def call(admin: int, method: str, path: str, token: str | None = None) -> tuple[int, str]:
    body = BODIES.get(f"{method} {path}")
    request = urllib.request.Request(
        f"http://127.0.0.1:{admin}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_documented_list_is_what_the_endpoint_does(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    listed = documented()
    assert {(m, p) for m, p, _ in listed} >= {
        ("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics"), ("GET", "/faults"),
        ("POST", "/faults"), ("DELETE", "/faults"), ("DELETE", "/faults/ID"),
        ("POST", "/recording/snapshot"), ("POST", "/live"),
    }, listed  # fmt: skip
    token = tmp_path / "admin-token"
    token.write_text(TOKEN + "\n")
    admin = free_port()
    proxy = start_proxy(broker.url, tmp_path, "--admin", f"127.0.0.1:{admin}",
                        "--admin-token-file", str(token), "--record", str(tmp_path / "rec"),
                        "--record-ring", "1M")  # fmt: skip
    try:
        wait_ready(admin)
        with client(proxy.url) as c:
            c.create_producer(topic).send(b"named in /metrics")
        for method, path, needs_token in listed:
            if path == "/faults/ID":  # a rule to remove
                status, text = call(admin, "POST", "/faults", TOKEN)
                assert status == 201, text
                path = f"/faults/{json.loads(text)['id']}"
            status, text = call(admin, method, path)
            if needs_token:
                assert status == 401 and "admin token" in text, (method, path, status, text)
                status, text = call(admin, method, path, "not-" + TOKEN)
                assert status == 401, (method, path, status, text)
                status, text = call(admin, method, path, TOKEN)
                assert status in (200, 201), (method, path, status, text)
            else:
                assert status == 200, (method, path, status, text)
        # What the list says anyone can read: the topic names in /metrics.
        status, text = call(admin, "GET", "/metrics")
        assert status == 200 and topic in text
    finally:
        proxy.kill()
    assert "Traceback" not in proxy.log(), proxy.log()
