"""A reload one worker refuses leaves nothing running in the worker that
had made it ready: the keys of the new configuration's OpenID Connect
issuers are not fetched on schedule once the supervisor dropped it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.support import https_answers
from tests.test_reload_workers import Issuers, oidc_workers, write


@pytest.mark.e2e
def test_an_aborted_reload_stops_what_a_worker_started_for_it(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    # Issuers by name: ``once`` answers its discovery document to the
    # first who asks only (one worker makes the reload ready, the other
    # refuses it); the others always.
    issuers = Issuers(keys="/{name}/jwks.json", once="once")

    def fetched(name: str) -> int:
        return issuers.fetched(f"/{name}/jwks.json")

    with (
        https_answers(tmp_path, issuers.answer) as (base, ca),
        oidc_workers(broker, tmp_path, ca, [f"{base}/good"],
                     # Keys fetched again every second: a task left running shows.
                     "--auth-oidc-refresh", "1") as (proxy, config, _),
    ):  # fmt: skip
        # The file's change is the reload (one, not one more after an
        # admin request's).
        write(config, [f"{base}/fresh", f"{base}/once"])
        deadline = time.monotonic() + 60
        while "sluice.workers: configuration reload (file): refused" not in proxy.log():
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.05)
        assert fetched("once") == 1, issuers.asked  # one worker made it ready
        # A refused file reload is tried again for a while (each try fetches
        # "fresh" anew, and is dropped as well): the file put back as in
        # force ends the tries.
        write(config, [f"{base}/good"])
        deadline = time.monotonic() + 60
        while "sluice.workers: configuration reload (file): unchanged" not in proxy.log():
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.05)
        after = fetched("fresh")
        # Both workers fetch the issuer in force every second: six
        # fetches are three rounds, in which a task still running for
        # the dropped reload would have fetched "fresh" again.
        good = fetched("good")
        deadline = time.monotonic() + 30
        while fetched("good") < good + 6:
            assert time.monotonic() < deadline, (issuers.asked, proxy.log())
            time.sleep(0.05)
        assert fetched("fresh") == after, (issuers.asked, proxy.log())
        assert proxy.terminate() == 0
    assert "Traceback" not in proxy.log()
