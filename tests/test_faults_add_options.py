"""``sluice faults add`` with options that make a rule the proxy would
refuse (``--protocol nope --drop``, ``--message`` beside ``--drop`` …): a
usage error (exit 2) in one line naming the option, said before any call
to the admin endpoint, as for ``--rule JSON``. It went to the proxy, whose
refusal was exit 1, as if the proxy were down; with the proxy down, the
mistake was never said. No process is started."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from sluice.commands import faults as faults_command
from sluice.commands import main

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
    ("options", "option", "said"),
    [
        ("--protocol nope --drop", "--protocol", "unknown protocol 'nope'"),
        ("--command NOPE --drop", "--command", "unknown command 'NOPE'"),
        ("--protocol http --command GET --drop", "--command", "unknown command 'GET' for http"),
        ("--protocol http --corrupt", "--corrupt", "http rules may"),
        ("--protocol http --throttle 5", "--throttle", "not throttle"),
        ("--protocol http --direction to_client --delay 5ms", "--direction", "to_broker"),
        ("--error --direction to_client", "--direction", "to_broker"),
        ("--error BAD", "--error", "unknown error code 'BAD'"),
        ("--protocol http --error 999", "--error", "unknown error code '999' for http"),
        ("--error --command SEND_RECEIPT", "--command", "SEND_RECEIPT is none"),
        ("--throttle 0", "--throttle", "at least 1"),
        ("--delay 0", "--delay", "needs delay_ms > 0"),
        ("--delay 2h", None, None),  # (argparse: not a duration)
        ("--delay 99999s", "--delay", "at most"),
        ("--probability 2 --drop", "--probability", "between 0 and 1"),
        ("--probability -1 --drop", "--probability", "at least 0"),
        ("--after -1 --drop", "--after", "at least 0"),
        ("--times 0 --drop", "--times", "at least 1"),
        ("--message x --drop", "--message", "goes with an error rule"),
        ("--id 'bad id' --drop", "--id", "an id is 1 to 64"),
        ("--topic CONTROL --drop", "--topic", "control character"),
        (f"--client {'x' * 2000} --drop", "--client", "at most 1024"),
    ],
)
def test_options_the_proxy_would_refuse_are_a_usage_error_before_any_call(
    options: str,
    option: str | None,
    said: str | None,
    calls: list[tuple[Any, ...]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["faults", "add", "--admin", NOWHERE, *shlex.split(options)]
    if option is None:
        with pytest.raises(SystemExit) as usage:
            main(argv)
        assert usage.value.code == 2 and calls == []
        return
    argv = ["\x01" if arg == "CONTROL" else arg for arg in argv]
    assert main(argv) == 2
    assert calls == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"sluice faults: {option}: "), err
    assert said is not None and said in err, err


def test_options_the_proxy_takes_are_sent_as_before(
    calls: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["faults", "add", "--admin", NOWHERE, "--protocol", "http", "--topic", "/admin/*",
            "--error", "503", "--times", "2", "--id", "web"]  # fmt: skip
    assert main(argv) == 1  # the (unreachable) proxy was called
    rule = {"match": {"protocol": "http", "topic": "/admin/*"}, "action": "error",
            "error": "503", "times": 2, "id": "web"}  # fmt: skip
    assert calls == [(NOWHERE, "POST", "/faults", None, rule)]
    assert capsys.readouterr().err.count("\n") == 1
