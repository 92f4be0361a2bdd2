"""What a user writing their own filter is told about the mistakes they
make configuring it: a misplaced colon or brace in ``--filter``, JSON that
does not parse, a typo in the class's name, a settings dataclass typed in a
way no setting can fill. Each is one line that says what to change."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.filters.config import FilterConfigError, FilterSpec, load, parse_flag

MODULE = """
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sluice.filters import PASS, Filter


@dataclass(frozen=True)
class Settings:
    fields: Sequence[str] = ()
    limits: Mapping[str, int] = field(default_factory=dict)
    roles: frozenset[str] = frozenset()
    groups: dict[str, list[str]] = field(default_factory=dict)
    home: Path | None = None


class RequireField(Filter[Settings]):
    Settings = Settings

    def on_produce(self, message):
        return PASS
"""
NAME = "sluice_test_user_settings:RequireField"


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sluice_test_user_settings.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))


def _problems(spec: FilterSpec) -> list[str]:
    with pytest.raises(FilterConfigError) as caught:
        load([spec])
    return caught.value.problems


def test_a_flag_without_the_colon_before_its_json_says_how_to_write_it() -> None:
    """'mod:Cls {...}' was split at the colon inside the JSON and said
    "settings are not a JSON object: Extra data (column 3)"; 'mod:Cls:[...]'
    became a class named 'Cls:[...]' that the module did not have."""
    with pytest.raises(FilterConfigError) as caught:
        parse_flag('mine:Mask {"settings": {}}')
    (line,) = caught.value.problems
    assert "'mine:Mask {\"settings\"' is not a filter name" in line
    assert "NAME:{JSON object}" in line
    with pytest.raises(FilterConfigError, match="'mine:Mask:\\[1\\]' is not a filter name"):
        parse_flag("mine:Mask:[1]")


def test_json_that_does_not_parse_is_shown_where() -> None:
    """The JSON is the filter's whole table (topics, direction, settings),
    not its settings, and a column alone did not say where in it."""
    with pytest.raises(FilterConfigError) as caught:
        parse_flag('mine:Mask:{"settings": {"count": 1,}}')
    assert caught.value.problems == [
        "--filter mine:Mask: what follows 'mine:Mask:' is not a JSON object: Expecting property "
        'name enclosed in double quotes (at character 26 of it, after \'..."settings": '
        '{"count": 1,\')'
    ]
    with pytest.raises(FilterConfigError, match=r"at character 2 of it, after '\{'"):
        parse_flag("mine:Mask:{'settings': {}}")  # the shell's quotes, not JSON's


def test_a_typo_in_the_class_name_suggests_the_class(module: None) -> None:
    assert _problems(FilterSpec("sluice_test_user_settings:RequireFeild")) == [
        "filter 'sluice_test_user_settings:RequireFeild': sluice_test_user_settings has no "
        "'RequireFeild' (did you mean 'RequireField'?)"
    ]
    (line,) = _problems(FilterSpec("sluice_test_user_settings:requirefield"))
    assert line.endswith("(did you mean 'RequireField'?)")
    (line,) = _problems(FilterSpec("sluice_test_user_settings:Nothing"))
    assert line.endswith("has no 'Nothing'")


def test_a_name_without_its_module_or_class_says_so(module: None) -> None:
    """':Cls' said "cannot import : ValueError: Empty module name"; 'mod:'
    said the module was not a Filter subclass."""
    for name in (":RequireField", "sluice_test_user_settings:"):
        assert _problems(FilterSpec(name)) == [
            f"filter {name!r}: give module:attr, the module and the class in it both named"
        ]


def test_sequences_mappings_and_sets_are_settings_too(module: None) -> None:
    """A Settings field typed Sequence[str], Mapping[str, int] or
    frozenset[str] refused every value, with "must be Sequence"."""
    settings = {"fields": ["id"], "limits": {"a": 1}, "roles": ["x", "x"], "groups": {"g": ["u"]}}
    (loaded,) = load([FilterSpec(NAME, settings=settings)])
    got = loaded.filter.settings
    assert (got.fields, got.limits, got.roles, got.groups) == (
        ["id"],
        {"a": 1},
        frozenset({"x"}),
        {"g": ["u"]},
    )


def test_a_wrong_value_in_a_table_says_what_the_table_holds(module: None) -> None:
    """dict[str, int] was "must be a table, not {'a': 'b'}": a table it was."""
    given = {"limits": {"a": "b"}, "groups": {"g": "u"}, "fields": "id"}
    assert _problems(FilterSpec(NAME, settings=given)) == [
        f"filter {NAME!r}: setting 'fields' must be a list of strings, not 'id'",
        f"filter {NAME!r}: setting 'limits' must be a table of integers, not {{'a': 'b'}}",
        f"filter {NAME!r}: setting 'groups' must be a table of lists of strings, not {{'g': 'u'}}",
    ]


def test_a_setting_no_value_can_fill_blames_the_filter_not_the_value(module: None) -> None:
    """A Path field said "must be Path or nothing, not '/x'": the user
    could give nothing that passed."""
    (line,) = _problems(FilterSpec(NAME, settings={"home": "/x"}))
    assert line.startswith(
        f"filter {NAME!r}: setting 'home' cannot be given: RequireField.Settings types it "
        "pathlib.Path | None, "
        "which is no type a setting has"
    )


@pytest.mark.parametrize("pattern", ["orders", "persistent://orders"])
def test_a_topic_pattern_that_can_match_no_completed_name_is_refused(pattern: str) -> None:
    with pytest.raises(FilterConfigError) as caught:
        parse_flag(f'schema:{{"topics": ["{pattern}", "acme/*", "*orders"]}}')
    (problem,) = caught.value.problems
    assert f"topics: '{pattern}' matches no topic" in problem
    assert "'persistent://public/default/orders'" in problem
