"""The container image's Python packages are pinned: every ``pip install``
of the Dockerfile takes its versions from image-constraints.txt (``-c``),
which pins each package it installs, dependencies of dependencies too (they
were resolved on the day of the build: two builds could differ from each
other and from what the test suite ran with).

Run as a program, this prints the file from the environment it runs in
(the suite's: the packages each pip install asks for, with everything they
require, at the versions installed here):

    .venv/bin/python tests/test_image_constraints.py > image-constraints.txt
"""

from __future__ import annotations

import fnmatch
import importlib.metadata as metadata
import re
import shlex
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
CONSTRAINTS = ROOT / "image-constraints.txt"
# Where the build stage puts it (and the wheel, which the later stages copy).
IN_IMAGE = "/wheels/image-constraints.txt"

HEADER = """\
# The container image's Python packages, pinned: every pip install of the
# Dockerfile uses this file (-c /wheels/image-constraints.txt), so that an
# image built on any day installs the versions the test suite ran with.
# It pins what the image installs (the wheel's dependencies in pyproject.toml,
# the extras the Dockerfile names, the build stage's tools) and everything
# they require, as installed in the suite's environment (.venv).
# Regenerate after changing those dependencies or upgrading the environment:
#     .venv/bin/python tests/test_image_constraints.py > image-constraints.txt
# (tests/test_image_constraints.py checks that it pins them all.)
"""


def pip_installs(dockerfile: str) -> list[list[str]]:
    """The arguments of each ``pip install`` in ``dockerfile`` (after
    ``install``), its instructions' continued lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile)
    found = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for command in line.split("&&"):
            if "pip install" not in command:
                continue
            words = shlex.split(command)
            for i in range(len(words) - 1):
                if words[i].endswith("pip") and words[i + 1] == "install":
                    found.append(words[i + 2 :])
                    break
    return found


def _constraint_files(args: list[str]) -> list[str]:
    files = []
    for i, arg in enumerate(args):
        if arg in ("-c", "--constraint") and i + 1 < len(args):
            files.append(args[i + 1])
        elif arg.startswith("--constraint="):
            files.append(arg.split("=", 1)[1])
    return files


def _asked(args: list[str]) -> list[Requirement]:
    """What one pip install asks for: Sluice's wheel (its dependencies, and
    those of the extras named after it) or requirements."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    skip = set(_constraint_files(args))
    asked = []
    for arg in args:
        if arg.startswith("-") or arg in skip:
            continue
        if arg.startswith("/wheels/"):
            extras = re.search(r"\[([\w,-]+)\]$", arg)
            names = extras.group(1).split(",") if extras else []
            texts = project["dependencies"] + [
                text for name in names for text in project["optional-dependencies"][name]
            ]
            asked += [Requirement(text) for text in texts]
        else:
            asked.append(Requirement(arg))
    return asked


def needed(asked: list[Requirement]) -> dict[str, list[Requirement]]:
    """Every distribution ``asked`` brings, by name, with the requirements
    that bring it: from the metadata installed here (this environment runs
    the image's Python, 3.11 on Linux, so the markers read alike)."""
    found: dict[str, list[Requirement]] = {}
    todo = [(requirement, "") for requirement in asked]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        first = name not in found
        found.setdefault(name, []).append(requirement)
        if not first and not requirement.extras:
            continue
        try:
            requires = metadata.distribution(requirement.name).requires or []
        except metadata.PackageNotFoundError:
            raise AssertionError(f"{requirement.name} is not installed here") from None
        for text in requires:
            for wanted in ["", *sorted(requirement.extras)]:
                todo.append((Requirement(text), wanted))
    return found


def everything_asked() -> dict[str, list[Requirement]]:
    installs = pip_installs(DOCKERFILE.read_text())
    return needed([r for args in installs for r in _asked(args)])


def pins(text: str) -> dict[str, str]:
    """Name -> version of each ``name==version`` line (comments aside)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(\S+)", line)
        assert match, f"image-constraints.txt: not name==version: {line!r}"
        found[canonicalize_name(match.group(1))] = match.group(2)
    return found


def test_every_pip_install_of_the_image_uses_the_constraints() -> None:
    """Each pip install of each stage, the build stage's tools included,
    is constrained by the file, which the build stage copies in before its
    first one (into /wheels, which the later stages copy)."""
    dockerfile = DOCKERFILE.read_text()
    installs = pip_installs(dockerfile)
    assert len(installs) >= 3, installs  # build, runtime, demo
    for args in installs:
        assert _constraint_files(args) == [IN_IMAGE], args
    code = "\n".join(line for line in dockerfile.splitlines() if not line.startswith("#"))
    copy = code.index("COPY image-constraints.txt /wheels/")
    assert code.index(" AS build") < copy < code.index("pip install")
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert not any(fnmatch.fnmatch(CONSTRAINTS.name, pattern) for pattern in ignored)


def test_every_package_the_image_installs_is_pinned() -> None:
    """The wheel's dependencies (pyproject.toml), the demo extra's, the
    build stage's tools, and all they require: each has one exact version."""
    pinned = pins(CONSTRAINTS.read_text())
    wanted = everything_asked()
    assert {"trio", "pulsar-client", "cffi", "build"} <= set(wanted)  # (what is looked at)
    missing = sorted(set(wanted) - set(pinned))
    assert not missing, f"not pinned in image-constraints.txt: {missing} (regenerate it)"


def test_each_pin_meets_what_requires_it() -> None:
    """A pin outside a range pyproject.toml (or a dependency) asks for
    would fail the image's build: the file is regenerated with the range."""
    pinned = pins(CONSTRAINTS.read_text())
    for name, requirements in everything_asked().items():
        for requirement in requirements:
            if name in pinned:
                assert requirement.specifier.contains(pinned[name], prereleases=True), (
                    f"image-constraints.txt pins {name}=={pinned[name]}, "
                    f"but {requirement} is asked for"
                )


def render() -> str:
    """The file, from the versions installed in this environment."""
    lines = [f"{name}=={metadata.version(name)}" for name in sorted(everything_asked())]
    return HEADER + "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
