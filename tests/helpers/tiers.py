"""The suite's two tiers. A test is end-to-end (marker ``e2e``) when it starts
a process: a broker, a proxy, the installed command or another program. The
rest (units, properties, codecs, cores, golden files, in-process brokers) is
the fast tier, ``./dev test --fast`` (``pytest -m "not e2e"``).

Tests are marked from their fixtures (``E2E_FIXTURES``, by ``conftest.py``'s
``pytest_collection_modifyitems``); a test that starts a process itself says
so with ``@pytest.mark.e2e`` or a module's ``pytestmark``. While a test that
is not marked e2e sets up or runs, starting a process is refused (an audit
hook), so a test that belongs in the slow tier cannot hide in the fast one."""

from __future__ import annotations

import sys
from typing import Any

# Fixtures that start a broker, a proxy or another process (or need one that
# does): a test that uses one, directly or through another fixture, is e2e.
E2E_FIXTURES = frozenset(
    {
        # tests/conftest.py
        "broker",
        "apache_pulsar",
        "any_broker",
        "proxy",
        "any_proxy",
        # module fixtures that start their own
        "analyzed",  # test_analyze: brokers, proxies and Spark
        "big_broker",  # test_apache_pulsar
        "auth_broker",
        "tls_broker",
        "apache_recordings",
        "pp_broker",  # test_proxy_protocol: Apache Pulsar with PROXY headers
        "serve_recording",  # test_serve: a broker and a recording proxy
        "browser",  # test_view: Chromium
        "installed",  # test_install: a wheel built and installed
        "recording",  # test_replay
        "session",  # test_compiled_summaries: a recorded session
        "ws_broker",  # conftest: Apache Pulsar with its WebSocket service
        "oidc",  # test_oidc_e2e: Ory Hydra and Apache Pulsar with its OIDC provider
    }
)

# Audit events that start a process.
SPAWNS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system"}
)


class ProcessOutsideE2E(RuntimeError):
    """A test not marked e2e started a process."""


class Guard:
    """Refuses processes while ``running`` names a test that is not e2e, and
    keeps what it refused so that the test fails even if the code under test
    swallowed the exception."""

    def __init__(self) -> None:
        self.running: str | None = None
        self.refused: list[str] = []

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.running is None or event not in SPAWNS:
            return
        what = f"{event} {args[0]!r}" if args else event
        message = (
            f"{self.running} starts a process ({what}) but is not marked e2e: "
            "use a fixture from tests.helpers.tiers.E2E_FIXTURES or @pytest.mark.e2e"
        )
        self.refused.append(message)
        raise ProcessOutsideE2E(message)


GUARD = Guard()
sys.addaudithook(GUARD.audit)
