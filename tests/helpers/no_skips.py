"""A skipped test fails: a test that cannot run (a component missing, a
``pytest.skip`` left in) must say so in CI, not pass unseen. Loaded by
``tests/conftest.py``; an expected failure (``xfail``) is not a skip."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped, and tests here never skip: {reason}"
    return report
