"""`sluice demo` as the README and its own report tell a new user to run
it: `--embedded` alone, and every "Try next" command it prints."""

from __future__ import annotations

import shlex
from pathlib import Path

from sluice.commands import build_parser
from sluice.commands.demo import next_steps


def test_embedded_alone_is_pulsar_lite() -> None:
    # "use the embedded broker: sluice demo --embedded" was refused with
    # "expected one argument".
    parser = build_parser()
    assert parser.parse_args(["demo", "--embedded"]).embedded == "pulsar-lite"
    assert parser.parse_args(["demo", "--embedded", "--messages", "4"]).messages == 4
    assert parser.parse_args(["demo", "--embedded", "apache-pulsar"]).embedded == "apache-pulsar"
    assert parser.parse_args(["demo"]).embedded == "pulsar-lite"


def _parsed(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[0] == "sluice"
    build_parser().parse_args(words[1:])  # exits (SystemExit) on what sluice refuses
    return words[1:]


def test_every_next_step_is_a_command_sluice_takes() -> None:
    record = Path("/tmp/a demo recording")
    for live in (False, True):
        for command, _ in next_steps(record, "pulsar://127.0.0.1:41234", live):
            words = _parsed(command)
            assert str(record) in words or words[0] == "demo"


def test_the_next_steps_name_the_view_and_a_url_that_will_be_there() -> None:
    url = "pulsar://127.0.0.1:41234"
    after = dict(next_steps(Path("rec"), url, live=False))
    # The capture page the README shows first.
    assert "sluice view rec" in after
    # "point a client at URL" is true of the next run only on the same port.
    (again,) = [command for command in after if command.startswith("sluice demo")]
    assert _parsed(again) == ["demo", "--keep-running", "--port", "41234"]
    assert url in after[again]
    # While broker and proxy stay up: nothing says to start them again, and
    # replay has a broker to run against, this proxy.
    live = dict(next_steps(Path("rec"), url, live=True))
    assert not [command for command in live if command.startswith("sluice demo")]
    assert f"sluice replay rec --broker {url}" in live


def test_the_demo_to_run_again_is_in_front_of_the_same_broker() -> None:
    url = "pulsar://127.0.0.1:41234"
    for embedded in ("pulsar-lite", "apache-pulsar"):
        steps = next_steps(Path("rec"), url, live=False, embedded=embedded)
        (again,) = [command for command, _ in steps if command.startswith("sluice demo")]
        assert build_parser().parse_args(shlex.split(again)[1:]).embedded == embedded
