"""``sluice faults add --rule JSON`` with a rule the proxy would refuse: a
usage error (exit 2) in one line, said before any call to the admin
endpoint. It went to the proxy, whose refusal was exit 1, as if the proxy
were down; with the proxy down, the mistake in the rule was never said."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sluice.commands import faults as faults_command
from sluice.commands import main
from sluice.protocols import registry
from sluice.protocols.faults import FaultError, parse_rule

# Nothing listens there: a refusal must come before any call.
NOWHERE = "127.0.0.1:1"


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The admin calls made (none is sent: each fails as an unreachable endpoint would)."""
    made: list[tuple[Any, ...]] = []

    def call(*args: Any, **kw: Any) -> Any:
        made.append(args)
        raise faults_command.AdminError("cannot reach the admin endpoint (test)")

    monkeypatch.setattr(faults_command, "call", call)
    return made


@pytest.mark.parametrize(
    "rule",
    [
        {"action": "explode"},
        {"match": {"protocol": "nope"}, "action": "drop"},
        {"action": "delay"},
        {"action": "drop", "delay_ms": 5},
        {"action": "drop", "probability": 2},
        {"action": "drop", "colour": "red"},
        [1, 2],
    ],
)
def test_a_rule_the_proxy_would_refuse_is_a_usage_error_before_any_call(
    rule: object, calls: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(FaultError) as refused:  # the proxy's own reading of it
        parse_rule(rule, registry.all_faults())
    argv = ["faults", "add", "--admin", NOWHERE, "--rule", json.dumps(rule)]
    assert main(argv) == 2
    assert calls == []
    err = capsys.readouterr().err
    assert err == f"sluice faults: --rule: {refused.value}\n", err


def test_a_rule_the_proxy_takes_is_sent_as_given(
    calls: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    rule = {"match": {"command": "SEND"}, "action": "delay", "delay_ms": 50, "id": "slow"}
    assert main(["faults", "add", "--admin", NOWHERE, "--rule", json.dumps(rule)]) == 1
    assert calls == [(NOWHERE, "POST", "/faults", None, rule)]
    assert capsys.readouterr().err.count("\n") == 1
