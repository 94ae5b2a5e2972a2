"""Every Claims check in every chapter can fail: no check's condition or value is a constant.

A row such as ``claims.holds("B(250), B(1000)", True, ...)`` is shown as checked but
asserts nothing.  This parses each chapter's code cells and rejects, for every call of
``holds``, ``at_most``, ``at_least``, ``between`` and ``roundoff``, a condition (or
measured value) that is

- a constant expression: made of literals and operators only (``True``, ``1 < 2``,
  ``not False``, ``0.0``), or
- a name that every assignment in the chapter binds to the same constant expression
  (``ok = True`` then ``holds(..., ok)``).

A value that is only displayed belongs in ``Claims.shows``, which this does not inspect.
"""

import ast
import json
from collections import Counter
from pathlib import Path

import pytest
from IPython.core.inputtransformer2 import TransformerManager

BOOK = Path(__file__).resolve().parents[1] / "book"
CHAPTERS = sorted(BOOK.glob("*.ipynb"))
# The argument that carries what was measured, by position (after the claim) and by name.
CHECKS = {"holds": "ok", "at_most": "value", "at_least": "value", "between": "value",
          "roundoff": "error", "equal": "value"}  # fmt: skip


def code(path: Path) -> tuple[str, list[tuple[int, int]]]:
    """The chapter's code cells as one module (magics turned into Python as IPython does).

    Also returns ``(first line, cell index)`` for each cell, to name a cell in a failure.
    """
    transform = TransformerManager().transform_cell
    parts, starts, line = [], [], 1
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            text = transform("".join(cell["source"])).rstrip("\n") + "\n"
            parts.append(text)
            starts.append((line, index))
            line += text.count("\n")
    return "".join(parts), starts


# methods that change a list, dict or set in place: a name bound to an empty literal and then
# filled is not a constant
MUTATORS = {"append", "extend", "insert", "update", "add", "setdefault", "pop", "remove",
            "clear", "sort", "reverse", "discard"}  # fmt: skip


def is_constant(node: ast.AST) -> bool:
    """True for an expression made of literals and operators only."""
    allowed = (ast.Constant, ast.UnaryOp, ast.BinOp, ast.BoolOp, ast.Compare, ast.Tuple, ast.List,
               ast.Set, ast.unaryop, ast.operator, ast.boolop, ast.cmpop, ast.Load)  # fmt: skip
    return all(isinstance(n, allowed) for n in ast.walk(node))


def constant_names(tree: ast.AST) -> set[str]:
    """Names whose every binding in the module is ``name = <the same constant expression>``."""
    assigned: dict[str, list[str | None]] = {}  # each simple assignment: the constant, or None
    stores: Counter[str] = Counter()
    other: set[str] = set()  # bound by a def, an import, an argument or an except clause
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            value = ast.dump(node.value) if is_constant(node.value) else None
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(value)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            stores[node.id] += 1  # every binding: assignments, for targets, with-as, +=, :=
        elif isinstance(node, ast.arg):
            other.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            other.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            other.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            other.add(node.name)
        elif (  # a container filled after it was bound: changed = []; changed.append(...)
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.attr in MUTATORS
        ) or (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name)):  # fmt: skip
            other.add(node.value.id)
    return {
        name
        for name, values in assigned.items()
        if None not in values
        and len(set(values)) == 1
        and stores[name] == len(values)
        and name not in other
    }


def constant_checks(source: str, starts=((1, 0),)) -> list[str]:
    """``cell N: call`` for every Claims check whose measured argument is a constant."""
    tree = ast.parse(source)
    names = constant_names(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        keyword = CHECKS.get(node.func.attr)
        if keyword is None:
            continue
        args = node.args[1:2] + [k.value for k in node.keywords if k.arg == keyword]
        if any(is_constant(a) or (isinstance(a, ast.Name) and a.id in names) for a in args):
            cell = max((s for s in starts if s[0] <= node.lineno), default=(1, 0))[1]
            found.append(f"cell {cell}: {ast.unparse(node)[:120]}")
    return sorted(found, key=lambda text: int(text.split()[1].rstrip(":")))


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_claims_check_on_a_constant(path):
    found = constant_checks(*code(path))
    assert not found, (
        f"{path.name}: Claims checks that cannot fail (show a displayed value with "
        "claims.shows, or check something measured):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        'claims.holds("B(250), B(1000)", True, f"{b:.2f}")',
        'claims.holds("x", ok=True)',
        'Claims().at_least("x", 1.0, 0.5).holds("y", not False)',
        'claims.holds("x", 1 < 2, "yes")',
        'claims.at_most("x", 0.0, 1e-12)',
        'claims.between("x", -1, -2, 0)',
        'claims.roundoff("x", 0, 1e-12)',
        'ok = True\nclaims.holds("x", ok)',
        'ok = True\nok = True\nclaims.holds("x", ok)',
        'claims.equal("x", 3, 3)',
        'n = [1, 2]\nclaims.equal("x", n, [1, 2])',
    ],
)
def test_a_constant_condition_is_found(source):
    assert constant_checks(source)


@pytest.mark.parametrize(
    "source",
    [
        'claims.holds("x", err < 1e-12, f"{err:.0e}")',
        'claims.at_most("x", err, 1e-12)',
        'claims.shows("uniform guess", 1 / 32)',
        "raised = False\ntry:\n    f()\nexcept RuntimeError:\n    raised = True\n"
        'claims.holds("x", raised)',
        'ok = True\nfor x in xs:\n    ok = ok and x > 0\nclaims.holds("x", ok)',
        'ok = True\nok &= check()\nclaims.holds("x", ok)',
        'ok = check()\nclaims.holds("x", ok)',
        'claims.holds("x", len(xs) == 3)',
        'a = 1\nclaims.at_most("x", a - b, 0.1)',
        'found = []\nfor x in xs:\n    found.append(x)\nclaims.equal("x", found, [1])',
        'seen = {}\nseen["a"] = f()\nclaims.equal("x", seen, {"a": 1})',
    ],
)
def test_a_measured_condition_is_not_flagged(source):
    assert not constant_checks(source)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_markdown_tables_in_outputs_are_rendered_as_tables(path):
    """A code cell whose stored output is a Markdown table (a Claims table, a results table)
    needs ``mystnb.markdown_format: myst``: MyST-NB renders Markdown outputs as CommonMark
    otherwise, which has no tables, and the page shows the pipes as one paragraph."""
    flat = []
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] != "code":
            continue
        text = "".join(
            "".join(o["data"]["text/markdown"])
            for o in cell.get("outputs", [])
            if "text/markdown" in o.get("data", {})
        )
        fmt = cell["metadata"].get("mystnb", {}).get("markdown_format")
        if "\n|---" in text.replace(" ", "") and fmt != "myst":
            flat.append(index)
    assert flat == [], f"cells {flat} of {path.name} need mystnb.markdown_format: myst"
