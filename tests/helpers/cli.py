"""The ``sluice`` command line run in this process, and the OS refusing a
path: for tests of what a command says about its input, with no process."""

from __future__ import annotations

import contextlib
import errno
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.commands import main


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """``sluice ARGV``: its exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def refuse(monkeypatch: pytest.MonkeyPatch, name: str, denied: Path) -> None:
    """``os.<name>`` raises PermissionError for ``denied``, as for a user
    without the right to it (tests run as root, who may read anything)."""
    real: Callable[..., Any] = getattr(os, name)

    def refusing(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
        if isinstance(path, str | os.PathLike) and Path(path) == denied:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, name, refusing)
