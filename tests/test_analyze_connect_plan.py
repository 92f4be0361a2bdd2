"""Through Spark Connect every segment is decoded once, not once per table.

The decoder handed to ``mapInArrow`` is a closure in ``job._analyze``. A
Spark Connect client pickles it again each time it sends a query; if a
name it closes over is bound to another value after the decoded segments
were cached, the later queries carry another function, so another plan
than the cached one, and the server decodes every segment again for every
table (measured: 13 times per segment on a small run, 1 with this held).
Classic PySpark pickles it once, so only Connect shows it; this test holds
the closure's names unbound after it, without a server.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

from sluice.analyze import job


def bound_names(function: ast.AST, after: int) -> list[str]:
    """Every name bound in ``function``'s own body after line ``after``
    (nested functions' own bindings left out)."""
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                if child.lineno > after:
                    names.append(getattr(child, "name", ""))
                continue
            if (
                isinstance(child, ast.Name)
                and isinstance(child.ctx, ast.Store)
                and (child.lineno > after)
            ):
                names.append(child.id)
            visit(child)

    visit(function)
    return names


def test_the_decoders_closure_is_never_rebound() -> None:
    tree = ast.parse(textwrap.dedent(inspect.getsource(job._analyze)))
    analyze = tree.body[0]
    decoders = [
        node for node in ast.walk(analyze)
        if isinstance(node, ast.FunctionDef) and node.name == "reduce"
    ]  # fmt: skip
    assert len(decoders) == 1
    used = {n.id for n in ast.walk(decoders[0]) if isinstance(n, ast.Name)}
    code = next(c for c in job._analyze.__code__.co_consts
                if inspect.iscode(c) and c.co_name == "reduce")  # fmt: skip
    closed_over = sorted(code.co_freevars)
    assert set(closed_over) <= used
    # the frames' folder, the accumulator and the reducer (imported in _analyze)
    assert closed_over == ["frames_dir", "read", "reduce_batches"]
    rebound = [name for name in bound_names(analyze, decoders[0].end_lineno or 0)
               if name in closed_over]  # fmt: skip
    assert rebound == []
