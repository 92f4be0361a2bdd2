"""The container image's Dockerfile, read as text (building it needs a
container engine: `./dev image`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def test_the_default_base_is_the_debian_release_dev_image_builds_on() -> None:
    """`./dev image` builds and runs the image on Debian bookworm; the
    Dockerfile's default base names that release, not a tag (python:3.11-slim)
    that moves to Debian's next release on its own."""
    (base,) = re.findall(r"^ARG BASE=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    (tested,) = re.findall(r'^BASE_IMAGE="[^"]*:(\w+)"$', (ROOT / "dev").read_text(), re.MULTILINE)
    assert tested == "bookworm"
    assert re.fullmatch(rf"python:3\.11(\.\d+)?-slim-{tested}(@sha256:[0-9a-f]{{64}})?", base), base
