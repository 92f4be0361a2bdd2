"""What a power loss or a kernel crash can leave of a recording: Sluice
does not fsync, and a file system may have written a file's new size back
before its last data, which then reads as zero bytes. The records before
them are whole: readers read them and report the rest as a tail cut short
(as after ``kill -9``), not the whole segment as damaged; a file of zero
bytes only holds nothing, as an empty one."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

from sluice.commands import main
from sluice.recording.format import ReadResult, read_records
from sluice.recording.reader import load

INPUTS = Path(__file__).parent / "golden" / "analyze" / "inputs"
CAPTURE = INPUTS / "sluice-20261128T172608-f2b453b65503-0001.sluice"


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_a_tail_of_zero_bytes_is_a_tail_cut_short(tmp_path: Path) -> None:
    cut = ReadResult(CAPTURE)
    whole = list(read_records(CAPTURE, cut))
    data = CAPTURE.read_bytes()
    path = tmp_path / CAPTURE.name  # its whole records, then zeros
    path.write_bytes(data[: len(data) - cut.truncated_bytes] + bytes(8192))
    result = ReadResult(path)
    assert list(read_records(path, result)) == whole
    assert result.truncated_bytes == 8192
    code, out, err = _run(["inspect", str(path), "--summary"])
    assert code == 0, err
    assert f"{path}: ends with 8192 bytes of an incomplete record" in out
    recording = load(path, need_payloads=False)  # replay's and serve's reader
    assert recording.truncated == [path] and recording.frames > 0


def test_a_segment_of_zero_bytes_holds_nothing_among_others(tmp_path: Path) -> None:
    shutil.copy(CAPTURE, tmp_path / CAPTURE.name)
    zeros = tmp_path / "sluice-29991231T000000-ffffffffffff-0009.sluice"
    zeros.write_bytes(bytes(4096))
    code, _, err = _run(["inspect", str(tmp_path), "--summary"])
    assert code == 0, err
    code, _, err = _run(["inspect", str(zeros)])
    assert code == 2 and "holds only zero bytes (4096)" in err, err
