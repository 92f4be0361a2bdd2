"""Loading a user's filter by module path (``--filter module:attr``): what
the operator is told when the module cannot be had. Each mistake is one
line (a ``FilterConfigError``), never the end of the process."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.filters.config import FilterConfigError, FilterSpec, load

GOOD = """
from sluice.filters import Filter, NoSettings

class Mine(Filter[NoSettings]):
    def on_produce(self, message):
        return None
"""


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> None:
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_missing_module_and_a_syntax_error_are_one_line_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(tmp_path, monkeypatch, "sluice_test_broken_filter", GOOD.replace("):", ")", 1))
    with pytest.raises(FilterConfigError) as caught:
        load([FilterSpec("sluice_test_no_such_filter:Mine"),
              FilterSpec("sluice_test_broken_filter:Mine")])  # fmt: skip
    first, second = caught.value.problems
    assert first == (
        "filter 'sluice_test_no_such_filter:Mine': cannot import sluice_test_no_such_filter: "
        "ModuleNotFoundError: No module named 'sluice_test_no_such_filter'"
    )
    assert second.startswith(
        "filter 'sluice_test_broken_filter:Mine': cannot import sluice_test_broken_filter: "
        "SyntaxError: "
    )
    assert "\n" not in second


def test_a_module_that_exits_on_import_is_a_mistake_said_not_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module calling sys.exit when imported (a script made a module, a
    library giving up) ended ``sluice proxy`` with its status and not a
    word of why."""
    _module(tmp_path, monkeypatch, "sluice_test_exiting_filter", "import sys\nsys.exit(4)\n")
    with pytest.raises(FilterConfigError) as caught:
        load([FilterSpec("sluice_test_exiting_filter:Mine")])
    assert caught.value.problems == [
        "filter 'sluice_test_exiting_filter:Mine': cannot import sluice_test_exiting_filter: "
        "SystemExit: 4"
    ]


def test_a_constructor_that_exits_is_a_mistake_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = GOOD + "\n    def __init__(self, settings):\n        raise SystemExit('no config')\n"
    _module(tmp_path, monkeypatch, "sluice_test_exiting_init", text)
    with pytest.raises(FilterConfigError) as caught:
        load([FilterSpec("sluice_test_exiting_init:Mine")])
    assert caught.value.problems == [
        "filter 'sluice_test_exiting_init:Mine': SystemExit: no config"
    ]


CHOICE = """
from dataclasses import dataclass
from typing import Literal

from sluice.filters import Filter, PASS


@dataclass(frozen=True)
class Settings:
    mode: Literal["pass", "reject"] = "pass"
    level: Literal[1, 2] | None = None


class Choosy(Filter[Settings]):
    Settings = Settings

    def on_produce(self, message):
        return PASS
"""


def test_a_setting_typed_as_a_choice_takes_its_choices_and_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Literal field refused every value, the one it named too:
    "setting 'mode' must be typing.Literal['pass', 'reject'], not 'pass'"."""
    _module(tmp_path, monkeypatch, "sluice_test_choosy_filter", CHOICE)
    name = "sluice_test_choosy_filter:Choosy"
    (loaded,) = load([FilterSpec(name, settings={"mode": "reject", "level": 2})])
    assert (loaded.filter.settings.mode, loaded.filter.settings.level) == ("reject", 2)
    with pytest.raises(FilterConfigError) as caught:
        load([FilterSpec(name, settings={"mode": "maybe", "level": True})])
    assert caught.value.problems == [
        f"filter {name!r}: setting 'mode' must be one of 'pass', 'reject', not 'maybe'",
        f"filter {name!r}: setting 'level' must be one of 1, 2 or nothing, not True",
    ]


LONG_WINDED = """
from dataclasses import dataclass

from sluice.filters import Filter, PASS


@dataclass(frozen=True)
class Settings:
    x: int = 0

    def __post_init__(self):
        raise ValueError("2 validation errors for Settings\\nx\\n  too small")


class Checks(Filter[Settings]):
    Settings = Settings

    def on_produce(self, message):
        return PASS


class Fails(Filter):
    def __init__(self, settings):
        raise RuntimeError("cannot open\\n  /etc/x: denied")

    def on_produce(self, message):
        return PASS
"""


def test_a_mistake_said_on_several_lines_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception's text over several lines (a validation library's)
    came out as several mistakes, the later ones without the filter's name:
    "sluice proxy: x", "sluice proxy:   too small"."""
    _module(tmp_path, monkeypatch, "sluice_test_long_winded", LONG_WINDED)
    with pytest.raises(FilterConfigError) as caught:
        load([FilterSpec("sluice_test_long_winded:Checks"),
              FilterSpec("sluice_test_long_winded:Fails")])  # fmt: skip
    assert caught.value.problems == [
        "filter 'sluice_test_long_winded:Checks': 2 validation errors for Settings x too small",
        "filter 'sluice_test_long_winded:Fails': RuntimeError: cannot open /etc/x: denied",
    ]
