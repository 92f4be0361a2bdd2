"""A recording file with nothing in it (a writer killed before its first
flush), given alone: every reader refuses it in one line, as ``sluice
replay`` does, rather than showing an empty capture."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sluice.view.index import Index
from tests.helpers.cli import run_main
from tests.helpers.support import SLUICE


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    path = tmp_path / "sluice-20260101T000000-0123456789ab-0001.sluice"
    path.write_bytes(b"")
    return path


@pytest.mark.parametrize("alone", ["file", "directory"])
@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "{path}"],
        ["inspect", "{path}", "--summary"],
        ["inspect", "{path}", "--json"],
        ["view", "{path}", "--export", "{out}"],
    ],
    ids=["inspect", "inspect --summary", "inspect --json", "view --export"],
)
def test_a_lone_empty_file_is_refused_in_one_line(
    empty: Path, tmp_path: Path, argv: list[str], alone: str
) -> None:
    target = empty if alone == "file" else empty.parent
    out = tmp_path / "x.html"
    code, stdout, stderr = run_main([a.format(path=target, out=out) for a in argv])
    command = argv[0]
    assert code == 2, (stdout, stderr)
    # Worded as replay words it (the reader's own message).
    assert (
        stderr.splitlines()[-1] == f"sluice {command}: {empty}: empty file, not a Sluice recording"
    )
    assert "0 frames" not in stdout + stderr
    assert not out.exists()


def test_the_view_index_of_a_lone_empty_file_is_an_error(empty: Path) -> None:
    index = Index(empty)
    index.build()
    assert index.error == f"{empty}: empty file, not a Sluice recording"


def test_an_empty_segment_among_others_is_still_one_counted_item(
    empty: Path, tmp_path: Path
) -> None:
    """Beside other segments an empty one holds nothing yet: said, not an error."""
    golden = Path(__file__).parent / "golden" / "analyze" / "inputs"
    segment = golden / "sluice-20261128T172608-f2b453b65503-0001.sluice"
    (tmp_path / segment.name).write_bytes(segment.read_bytes())
    code, stdout, _ = run_main(["inspect", str(tmp_path), "--summary"])
    assert code == 0 and f"{empty}: empty, an incomplete record" in stdout
    index = Index(tmp_path)
    index.build()
    assert not index.error and index.frames > 0
    assert f"{empty.name}: empty (the writer stopped before its first flush)" in index.truncated


@pytest.mark.e2e
def test_view_refuses_a_lone_empty_file_before_serving(empty: Path) -> None:
    """Without --export the page would be served over nothing: refused at once."""
    # A view that served would never end; a busy host may take seconds to
    # start Python and import Sluice.
    result = subprocess.run([*SLUICE, "view", str(empty), "--listen", "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"sluice view: {empty}: empty file, not a Sluice recording"
    assert "http://" not in result.stdout
