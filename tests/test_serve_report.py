"""What `sluice serve` prints when it stops."""

from __future__ import annotations

from sluice.replay.outcome import Report


def test_identical_unanswered_requests_are_one_line_with_their_count() -> None:
    """A client retrying one request the recording has no answer for (the
    real client retries a failed lookup several times) made a line per try."""
    report = Report(requests=9, pushed=2)
    report.unmatched += ["PARTITIONED_METADATA persistent://public/default/t"] * 6
    report.unmatched += ["SUBSCRIBE persistent://public/default/u"]
    report.unmatched += ["PARTITIONED_METADATA persistent://public/default/t"]
    assert report.lines() == [
        "served 9 requests, pushed 2 messages, 8 without a recorded answer",
        "  no recorded answer: PARTITIONED_METADATA persistent://public/default/t (7 times)",
        "  no recorded answer: SUBSCRIBE persistent://public/default/u",
    ]
