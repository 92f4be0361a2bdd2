"""Optional parts of the install: which extra a command needs, and a check
that it is there. Imports nothing from Sluice, so any layer may use it."""

from __future__ import annotations

import importlib.util
import sys

# The extras of pyproject.toml's [project.optional-dependencies] that commands
# need: what each brings, and the modules (import names) it installs.
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "demo": ("the official client and the embedded broker", ("pulsar", "pulsar_lite")),
    "pipeline": ("PySpark, pyarrow, pandas and matplotlib",
                 ("pyspark", "pyarrow", "pandas", "matplotlib")),
}  # fmt: skip


def need_extra(command: str, extra: str) -> bool:
    """Whether ``extra`` is installed; if not, one line on stderr that says
    which extra ``sluice COMMAND`` needs and how to install it (the command
    then exits 2, before importing any of it)."""
    what, modules = EXTRAS[extra]
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        print(f"sluice {command} needs {what} (missing: {', '.join(missing)}): "
              f"pip install 'sluice[{extra}]'", file=sys.stderr)  # fmt: skip
    return not missing
