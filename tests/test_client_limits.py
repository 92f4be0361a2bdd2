"""Per-address connection limits count a client once however its address
is written: an IPv4 client reaching a dual-stack listener is
``::ffff:10.0.0.9``, the same client on an IPv4 listener ``10.0.0.9``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sluice.addresses import client_host
from sluice.proxy.shared import LIMITS_FILE, LocalLimits, SharedLimits, clear_row, create_state


def test_an_ipv4_client_is_one_client_however_its_address_is_written(tmp_path: Path) -> None:
    create_state(tmp_path, 2)
    for limits in (LocalLimits(10, 1), SharedLimits(10, 1, tmp_path / LIMITS_FILE, 0, 2)):
        assert limits.acquire("::ffff:10.0.0.9") is None
        assert limits.acquire("10.0.0.9") == "too many connections from 10.0.0.9"
        assert limits.acquire("::FFFF:10.0.0.9") is not None
        assert limits.acquire("::ffff:10.0.0.8") is None  # another client
        limits.release("10.0.0.9")  # however it is written, it gives back the same place
        assert limits.acquire("10.0.0.9") is None
        assert limits.active == 2


def test_client_host_unmaps_only_ipv4_mapped_addresses() -> None:
    assert client_host("::ffff:192.0.2.1") == "192.0.2.1"
    for host in ("192.0.2.1", "2001:db8::1", "::1", "fe80::1%eth0", "broker.example", "::ffff:1"):
        assert client_host(host) == host


def test_a_row_that_cannot_be_cleared_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = tmp_path / LIMITS_FILE
    table.mkdir()  # (an I/O error the supervisor must outlive: EISDIR here)
    with caplog.at_level(logging.WARNING, "sluice.proxy"):
        clear_row(table, 1)
    assert "worker 1's row of" in caplog.text and "not cleared" in caplog.text
    clear_row(tmp_path / "gone", 1)  # never made: nothing to say
    assert caplog.text.count("not cleared") == 1
