"""The suite's tiers (``tests/helpers/tiers.py``): end-to-end tests are
marked from their fixtures, and a test outside the e2e tier cannot start a
process, so ``./dev test --fast`` (``-m "not e2e"``) stays in-process."""

from __future__ import annotations

import ast
import collections
import subprocess
from pathlib import Path

import pytest

from tests.helpers.tiers import E2E_FIXTURES, GUARD, ProcessOutsideE2E

TESTS = Path(__file__).resolve().parent


def fixture_definitions() -> collections.Counter[str]:
    """How often each fixture name is defined under tests/ (by its source)."""
    found: collections.Counter[str] = collections.Counter()
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                "fixture" in ast.unparse(d) for d in node.decorator_list
            ):
                found[node.name] += 1
    return found


def test_each_e2e_fixture_is_defined_once() -> None:
    """The e2e fixtures are known by name: a name defined twice would mark
    (or leave unmarked) another module's fixture of the same name, and a
    name defined nowhere is a fixture renamed since."""
    defined = fixture_definitions()
    assert {name: defined[name] for name in E2E_FIXTURES if defined[name] != 1} == {}


def test_every_test_that_uses_an_e2e_fixture_is_marked(request: pytest.FixtureRequest) -> None:
    """Over this session's tests: under ``-m "not e2e"`` no collected test
    uses an e2e fixture; in the whole suite every test that does is marked."""
    items = request.session.items
    assert request.node in items and len(items) > 1
    unmarked = [
        item.nodeid
        for item in items
        if E2E_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("e2e") is None
    ]
    assert unmarked == []


def test_a_test_outside_the_e2e_tier_cannot_start_a_process() -> None:
    with pytest.raises(ProcessOutsideE2E, match="is not marked e2e"):
        subprocess.run(["true"], check=True)
    assert len(GUARD.refused) == 1
    GUARD.refused.clear()  # refused as expected: this test passes


@pytest.mark.e2e
def test_an_e2e_test_can_start_a_process() -> None:
    assert subprocess.run(["true"], check=True).returncode == 0
