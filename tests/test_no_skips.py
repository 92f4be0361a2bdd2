"""Tests never skip: a skip is reported as a failure (``tests/helpers/no_skips.py``)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_a_skip_fails_and_an_xfail_does_not(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        def test_skipped():
            pytest.skip("no broker here")

        @pytest.mark.skipif(True, reason="never on this machine")
        def test_skipped_by_mark():
            pass

        @pytest.mark.xfail(strict=True, reason="known")
        def test_expected_to_fail():
            assert False

        def test_passes():
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "tests.helpers.no_skips", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1, errors=1, xfailed=1)  # (a skipif: at setup)
    result.stdout.fnmatch_lines(["*skipped, and tests here never skip: *no broker here*"])
