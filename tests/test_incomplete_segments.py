"""Segments of a capture that hold no whole record (a writer stopped before
or during its first flush: empty, or cut inside its header), among others
and all alone: every reader skips such a segment among readable ones,
counting it as one incomplete item, and refuses a capture of nothing else
in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.recording.reader import listed
from sluice.view.index import Index
from tests.helpers.cli import run_main

INPUTS = Path(__file__).parent / "golden" / "analyze" / "inputs"
CAPTURE = INPUTS / "sluice-20261128T172608-f2b453b65503-0001.sluice"


@pytest.fixture
def cut(tmp_path: Path) -> Path:
    """A readable segment and, after it, one cut 30 bytes into its header."""
    (tmp_path / CAPTURE.name).write_bytes(CAPTURE.read_bytes())
    path = tmp_path / "sluice-20261128T172608-f2b453b65503-0002.sluice"
    path.write_bytes(CAPTURE.read_bytes()[:30])
    return path


def test_view_reads_the_rest_of_a_capture_with_a_segment_cut_in_its_header(cut: Path) -> None:
    index = Index(cut.parent)
    index.build()
    assert index.error == ""
    assert index.frames > 0
    assert [t for t in index.truncated if t.startswith(cut.name)] == [
        f"{cut.name}: cut inside its header (30 bytes; the writer stopped during its first flush)"
    ]


def test_view_export_of_a_capture_with_a_segment_cut_in_its_header(
    cut: Path, tmp_path: Path
) -> None:
    out = tmp_path / "x.html"
    code, _, err = run_main(["view", str(cut.parent), "--export", str(out)])
    assert code == 0, err
    assert out.exists()
    alone = Index(cut.parent / CAPTURE.name)  # the readable segment's frames, all of them
    alone.build()
    assert alone.frames > 0
    assert f"({alone.frames} in the capture)" in err, err


def test_view_still_refuses_a_lone_segment_cut_in_its_header(cut: Path) -> None:
    index = Index(cut)
    index.build()
    assert index.error == f"{cut}: ends inside its header (30 bytes), not a readable recording"


def test_view_skips_a_segment_removed_after_it_was_listed(
    cut: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention removes the oldest segments while a capture is read: one
    gone between the listing and its reading is said and skipped."""

    def listed_then_removed(target: Path) -> list[Path]:
        paths = listed(target)
        cut.unlink()  # after the listing, as retention would
        return paths

    monkeypatch.setattr("sluice.view.index.listed", listed_then_removed)
    index = Index(cut.parent)
    index.build()
    assert index.error == ""
    assert index.frames > 0
    assert f"{cut.name}: removed while being read (retention), skipped" in index.truncated
