"""Shared fixtures. Tests that need a real component start it here and fail,
never skip, when it is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def reference_dir() -> Path:
    """The protocol reference material (``shared/reference`` beside the checkout)."""
    configured = os.environ.get("SLUICE_REFERENCE_DIR")
    path = Path(configured) if configured else ROOT.parent / "shared" / "reference"
    if not (path / "PulsarApi.proto").is_file():
        pytest.fail(
            f"upstream PulsarApi.proto not found in {path}; "
            "set SLUICE_REFERENCE_DIR to the directory holding it"
        )
    return path
