"""Shared fixtures. Tests that need a real component start it here and fail,
never skip, when it is missing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.embedded import EmbeddedBroker
from tests.support import ProxyProcess, start_proxy


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """One real pulsar-lite broker for the whole test session."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def proxy(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[ProxyProcess]:
    """A `sluice proxy` process in front of the session broker."""
    p = start_proxy(broker.url, tmp_path)
    yield p
    p.kill()
    assert "Traceback" not in p.log(), p.log()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")
    return f"persistent://public/default/{name}-{uuid.uuid4().hex[:8]}"
