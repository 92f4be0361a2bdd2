"""A delay rule whose jitter is larger than its delay, given to ``sluice
faults add`` or to the proxy (its ``--faults`` file, POST /faults): refused
with one line, a usage error on the command line. It was accepted, and the
frames it drew below zero went at once, held 0ms, not spread as asked."""

from __future__ import annotations

import pytest

from sluice.commands import main
from sluice.protocols import registry
from sluice.protocols.faults import FaultError, parse_rule

# Nothing listens there: a refusal must come before any call.
NOWHERE = "127.0.0.1:1"


def test_a_jitter_larger_than_the_delay_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["faults", "add", "--admin", NOWHERE, "--delay", "100ms", "--jitter", "0.2s"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        "sluice faults: --jitter 200ms is more than --delay 100ms: a delay cannot go below 0 "
        "(give a jitter of at most the delay)\n"
    ), err


def test_a_jitter_as_large_as_the_delay_is_taken() -> None:
    from sluice.commands import build_parser
    from sluice.commands.faults import rule_from

    argv = ["faults", "add", "--admin", NOWHERE, "--delay", "100ms", "--jitter", "100ms"]
    rule = rule_from(build_parser().parse_args(argv))
    assert rule == {"match": {}, "action": "delay", "delay_ms": 100, "jitter_ms": 100}
    parse_rule(rule, registry.all_faults())  # and the proxy takes it


def test_a_jitter_without_a_delay_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """It went to the proxy, which refused it: exit 1, as if the proxy were
    down, for a mistake in the command line."""
    assert main(["faults", "add", "--admin", NOWHERE, "--drop", "--jitter", "5ms"]) == 2
    err = capsys.readouterr().err
    assert err == "sluice faults: --jitter goes with --delay\n", err


def test_the_proxy_refuses_a_jitter_larger_than_the_delay() -> None:
    """The same rule where the proxy reads rules (its --faults file, the
    admin endpoint's POST /faults)."""
    with pytest.raises(FaultError) as caught:
        parse_rule({"action": "delay", "delay_ms": 100, "jitter_ms": 100.5},
                   registry.all_faults())  # fmt: skip
    assert str(caught.value) == (
        "jitter_ms 100.5 is more than delay_ms 100: a delay cannot go below 0 "
        "(give a jitter of at most the delay)"
    )
