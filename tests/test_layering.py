"""The layers of docs/architecture.md, checked on the imports themselves.

An ``ast`` walk rather than import-linter: which modules are a protocol's own
I/O half (and may name it) is read from the registry at test time, each
``ProtocolSpec``'s ``"module:attr"`` references, which a static contract
file cannot say. Every import counts, inside functions and under
TYPE_CHECKING too.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from sluice.protocols import registry

ROOT = Path(__file__).resolve().parent.parent
SLUICE = ROOT / "sluice"

# The table in docs/architecture.md ("Layers"), by package or module.
LAYERS = {
    "sluice.addresses": 0,
    "sluice.errors": 0,
    "sluice.protocols": 1,
    "sluice.recording": 2,
    "sluice.filters": 2,
    "sluice.proxy": 3,
    "sluice.replay": 4,
    "sluice.analyze": 4,
    "sluice.view": 4,
    "sluice.commands": 5,
}
# Import nothing from Sluice (or, brokers/, only the Pulsar codec and
# embedded.py): any layer may use them.
SIBLINGS = 4  # the layer whose packages never import one another
FREE = (
    "sluice.config",
    "sluice.logs",
    "sluice.extras",
    "sluice.brokers",
    "sluice._frames",
)
# What a module above the protocol packages may import from sluice/protocols/.
NEUTRAL = {
    f"sluice.protocols.{name}"
    for name in ("core", "errors", "faults", "filtering", "haproxy", "registry", "urls")
}
# Layer 4's siblings reach protocols only through the registry (and the neutral modules).
THROUGH_REGISTRY = ("sluice.recording", "sluice.view", "sluice.analyze", "sluice.replay")


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(SLUICE.rglob("*.py")):
        if path.name.endswith("_pb2.py"):
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, ast.parse(path.read_text(), str(path))


def imported(tree: ast.Module, module: str) -> Iterator[str]:
    """Every module ``tree`` imports (``from a import b`` names a and a.b)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                base = ".".join([*module.split(".")[: -node.level], base]).rstrip(".")
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def within(name: str, prefixes: tuple[str, ...] | set[str] | dict[str, int]) -> str | None:
    for prefix in prefixes:
        if name == prefix or name.startswith(prefix + "."):
            return prefix
    return None


def protocol_packages() -> set[str]:
    """The packages under sluice/protocols/ that describe a protocol (spec.py)."""
    return {f"sluice.protocols.{p.parent.name}" for p in (SLUICE / "protocols").glob("*/spec.py")}


def protocol_owned() -> dict[str, str]:
    """A protocol's own I/O half (backend, recorder, replay, serve): the
    modules outside sluice/protocols/ that its registry entry names and that
    bear its name (``sluice/<layer>/<protocol>.py``), by module."""
    owned = {}
    for spec in registry.protocols().values():
        for value in vars(spec).values():
            if isinstance(value, str) and re.fullmatch(r"sluice(\.\w+)+:\w+", value):
                module = value.partition(":")[0]
                if module.rpartition(".")[2] == spec.name:
                    owned[module] = spec.name
    return owned


def layer_problems() -> list[str]:
    problems = []
    packages = protocol_packages()
    owned = protocol_owned()
    for module, tree in modules():
        layer_of = within(module, LAYERS)
        own_protocol = within(module, packages)
        for name in set(imported(tree, module)):
            if within(module, ("sluice.protocols",)) and within(name, ("trio",)):
                problems.append(f"{module} imports trio")
            if not name.startswith("sluice.") or within(name, FREE) or layer_of is None:
                continue
            target = within(name, LAYERS)
            if target is None or target == layer_of:
                continue
            if LAYERS[target] > LAYERS[layer_of]:
                problems.append(f"{module} (layer {LAYERS[layer_of]}) imports {name} "
                                f"(layer {LAYERS[target]})")  # fmt: skip
            elif LAYERS[target] == LAYERS[layer_of] == SIBLINGS:
                problems.append(f"{module} imports its sibling {name}")
            other = within(name, packages)
            if own_protocol is not None and other is not None and other != own_protocol:
                problems.append(f"{module} imports another protocol's {name}")
            if (
                within(module, THROUGH_REGISTRY)
                and module not in owned
                and other is not None
                and name not in NEUTRAL
            ):
                problems.append(f"{module} reaches {name} around the registry")
    return sorted(set(problems))


def test_layers_hold() -> None:
    assert layer_problems() == []


# Modules above the protocol packages that name a protocol for what they
# are, not to branch on it: sluice demo, the brokers it and the tests start
# (pulsar-lite, Apache Pulsar), and the extra that installs their clients.
NAMES_ALLOWED = (
    "sluice.commands.demo",
    "sluice.brokers",
    "sluice.extras",
)
# Lines still owed, by module: none (the last two, in proxy/config.py, went
# with Pulsar's proxy authentication moving to its spec and backend).
NAMES_OWED: dict[str, int] = {}


def name_lines(root: Path, names: tuple[str, ...] = ("pulsar", "cursus")) -> dict[str, int]:
    """Lines of code (not docstrings or comments) above sluice/protocols/
    that name a protocol, by module: a string that is a name or one of the
    names' URL schemes, or an identifier, attribute or import that holds one."""
    word = re.compile("|".join(names), re.IGNORECASE)
    values = {v for n in names for v in (n, f"{n}+ssl", f"{n}://", f"{n}+ssl://")}
    found = {}
    for path in sorted((root / "sluice").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module.startswith("sluice.protocols") or path.name.endswith("_pb2.py"):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        lines = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                hit = id(node) not in docstrings and node.value.lower() in values
            elif isinstance(node, ast.Name):
                hit = bool(word.search(node.id))
            elif isinstance(node, ast.Attribute):
                hit = bool(word.search(node.attr))
            elif isinstance(node, ast.ImportFrom):
                hit = any(
                    word.search(n) for n in [node.module or "", *(a.name for a in node.names)]
                )
            elif isinstance(node, ast.Import):
                hit = any(word.search(a.name) for a in node.names)
            else:
                hit = False
            if hit and isinstance(node, ast.expr | ast.stmt):
                lines.add(node.lineno)
        if lines:
            found[module] = len(lines)
    return found


def test_no_protocol_is_named_above_the_protocol_packages() -> None:
    """Outside sluice/protocols/, only a protocol's own I/O half (named by its
    registry entry) names it; the registry's table is in sluice/protocols/."""
    owned = protocol_owned()
    found = {
        module: count
        for module, count in name_lines(ROOT, registry.names()).items()
        if module not in owned and not within(module, NAMES_ALLOWED)
    }
    assert found == NAMES_OWED


if __name__ == "__main__":  # the count, for any checkout: python tests/test_layering.py ROOT
    import sys

    counted = name_lines(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    for module, count in sorted(counted.items(), key=lambda item: -item[1]):
        print(f"{count:4d} {module}")
    print(f"{sum(counted.values())} lines in {len(counted)} modules")
