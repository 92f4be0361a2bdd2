"""A snapshot whose write fails part way (the disk full, a file size
limit) leaves no file behind: never a cut capture that readers then take
for a damaged recording of that moment."""

from __future__ import annotations

import json
import resource
from pathlib import Path

from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.recording.format import recording_files
from tests.helpers.support import client, start_proxy
from tests.test_flight_recorder import TOKEN, http_post

LIMIT = 256 * 1024  # the proxy's file size limit: its snapshot fails past it


def small_files() -> None:
    # Python ignores SIGXFSZ: a write past the limit fails with EFBIG.
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def test_a_snapshot_that_cannot_be_written_whole_leaves_no_file(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    record, admin = tmp_path / "rec", free_port()
    (tmp_path / "admin-token").write_text(TOKEN)
    proxy = start_proxy(broker.url, tmp_path, "--record", str(record), "--record-payloads",
                        "full", "--record-ring", "8M", "--admin", f"127.0.0.1:{admin}",
                        "--admin-token-file", str(tmp_path / "admin-token"),
                        preexec=small_files)  # fmt: skip
    try:
        with client(proxy.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            for _ in range(100):  # 1 MB in the ring
                producer.send(b"p" * 10_000)
            status, answer = http_post(admin, json.dumps({"reason": "too big"}).encode())
            small = http_post(admin, json.dumps({"last": 0.001}).encode())
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    assert status == 500, answer
    assert "could not be written" in answer
    # A small one still fits; the failed one left nothing (nor its directory).
    assert small[0] == 201, small
    assert recording_files(record) == [Path(json.loads(small[1])["file"])]
    assert [p.name for p in record.iterdir()] == [Path(json.loads(small[1])["path"]).name]
