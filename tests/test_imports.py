"""The package has no import cycles: every module's imports (at any depth) form a DAG.

Imports are read with ``ast`` from the source.  Every way one module makes Python load
another is an arrow, also when it happens later than at import time (a deferred import
still ties two modules together: whichever runs first, each needs the other):

* ``import x`` and ``from x import y`` anywhere: at module level, inside a function,
  a method or an ``if``;
* ``importlib.import_module("posenc.x")`` (or ``import_module(".x", __package__)``,
  ``__import__("posenc.x")``) with a literal name;
* ``import_module`` with a name built at run time (an f-string over a table).  Those
  are not literal, so the source alone does not say where they go.  Each module that
  does it is listed in :data:`TABLES` with the table its names come from, and the test
  reads that table from the source and draws an arrow to every module it names; a
  dynamic import anywhere else fails :func:`test_every_dynamic_import_is_accounted_for`
  until it is listed.  The two today:

  - ``posenc.registry`` imports every scheme module named in ``_ENTRIES`` (and
    ``posenc/__init__.py`` exports their ``__all__`` through it): the registry is a
    leaf-importer of the scheme modules, so a scheme module may never import the
    registry (nor anything that does);
  - ``posenc/__init__.py``'s ``__getattr__`` loads the lazy submodules named in
    ``_LAZY_SUBMODULES`` (``analysis``, ``viz``) on first use.

(``posenc.scheme``'s deprecated names from ``posenc.attend`` are handed over by
``attend`` when it is imported, ``scheme._SERVED``, so they draw no arrow back.)

A circle that had to be accepted for a while would be listed in :data:`ALLOWED`, each
arrow with its reason and the release that removes it;
:func:`test_each_allowed_arrow_is_still_needed` fails once an arrow no longer closes a
circle, so the list cannot outlive its reason.  It is empty: the house has no circle.

The layout stays what the design says: contract and registry, masks, the attention
entry point, flex, the kernels, and the scheme modules on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import posenc

ROOT = Path(posenc.__file__).resolve().parent

# module -> (name of its table, how an entry of the table names a module of the package)
TABLES = {
    "posenc.registry": ("_ENTRIES", lambda key, value: "posenc." + value.split(":")[0]),
    "posenc": ("_LAZY_SUBMODULES", lambda key, value: f"posenc.{key}"),
}

# Arrows that close a circle and are accepted for now: (importer, imported) -> why.
ALLOWED: dict[tuple[str, str], str] = {}


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, level: int, package: str) -> str:
    """``from ..x import`` / ``import_module(".x", ...)`` relative to ``package``."""
    if not level:
        return name
    anchor = package.split(".")
    anchor = anchor[: len(anchor) - (level - 1)]
    return ".".join(anchor + ([name] if name else []))


def _is_import_call(node: ast.Call) -> bool:
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return called in ("import_module", "__import__")


def _table(tree: ast.Module, name: str, table: str, to_module) -> set[str]:
    """The modules named by the literal ``table`` assigned at module level."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(getattr(t, "id", None) == table for t in targets):
            value = ast.literal_eval(node.value)
            items = value.items() if isinstance(value, dict) else ((v, v) for v in value)
            return {to_module(k, v) for k, v in items}
    raise AssertionError(f"{name} has no module-level table {table}")


def _imports(path: Path, name: str, known: set[str], tables: dict) -> tuple[set[str], list[int]]:
    """(modules of the package that ``name`` imports, lines of its non-literal imports)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    found, dynamic = set(), []
    for node in ast.walk(tree):  # every depth: module level, functions, methods, branches
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, package)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and _is_import_call(node) and node.args:
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                dynamic.append(node.lineno)
                continue
            target = first.value
            level = len(target) - len(target.lstrip("."))
            anchor = package
            if len(node.args) > 1 and getattr(node.args[1], "id", None) == "__name__":
                anchor = name
            targets = [_resolve(target[level:], level, anchor)]
        else:
            continue
        found |= {t for t in targets if t in known}
    if name in tables:
        found |= _table(tree, name, *tables[name]) & known
    return found - {name}, dynamic


def graph(root: Path = ROOT, tables: dict = TABLES) -> tuple[dict[str, set[str]], dict]:
    """(module -> modules it imports, module -> lines of dynamic imports not in ``tables``)."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    known = set(files)
    edges, unaccounted = {}, {}
    for name, path in files.items():
        edges[name], dynamic = _imports(path, name, known, tables)
        if dynamic and name not in tables:
            unaccounted[name] = dynamic
    # importing a submodule runs its package's __init__ first: not an edge of the design
    top = root.name
    edges = {
        n: {t for t in ts if not n.startswith(t + ".") and t != top} for n, ts in edges.items()
    }
    return edges, unaccounted


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state:
                cycle = visit(m)
                if cycle:
                    return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            cycle = visit(n)
            if cycle:
                return cycle
    return None


def _without(edges: dict[str, set[str]], arrows) -> dict[str, set[str]]:
    return {n: {t for t in ts if (n, t) not in arrows} for n, ts in edges.items()}


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_a_deferred_import_module_loop_is_found(tmp_path):
    # the shape of the loop posenc had: hf -> scaling at import, scaling -> hf when called
    root = _package(tmp_path, {
        "__init__.py": "",
        "hf.py": "from .scaling import Scaling\n",
        "scaling.py": (
            "import importlib\n\nclass Scaling:\n    @classmethod\n    def read(cls):\n"
            "        return importlib.import_module('pkg.hf')\n"
        ),
    })  # fmt: skip
    edges, unaccounted = graph(root, {})
    assert edges["pkg.scaling"] == {"pkg.hf"} and not unaccounted
    assert find_cycle(edges) == ["pkg.hf", "pkg.scaling", "pkg.hf"]


def test_relative_and_function_level_imports_are_arrows(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "def f():\n    from .b import g\n    return g\n",
        "b.py": (
            "import importlib\ng = 1\n"
            "def h():\n    return importlib.import_module('.c', __package__)\n"
        ),
        "c.py": "def k():\n    import pkg.a\n",
    })  # fmt: skip
    edges, _ = graph(root, {})
    assert (
        edges["pkg.a"] == {"pkg.b"} and edges["pkg.b"] == {"pkg.c"} and edges["pkg.c"] == {"pkg.a"}
    )
    assert find_cycle(edges) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]


def test_a_table_driven_loop_is_found_and_an_unlisted_one_is_reported(tmp_path):
    files = {
        "__init__.py": "",
        "registry.py": (
            "import importlib\n_ENTRIES = {'x': 'scheme:X'}\n"
            "def load():\n    return [importlib.import_module(f'pkg.{m}') for m in ('scheme',)]\n"
        ),
        "scheme.py": "from . import registry\nclass X: ...\n",
    }
    root = _package(tmp_path, files)
    table = {"pkg.registry": ("_ENTRIES", lambda k, v: "pkg." + v.split(":")[0])}
    edges, unaccounted = graph(root, table)
    assert find_cycle(edges) == ["pkg.registry", "pkg.scheme", "pkg.registry"]
    # without its table the f-string import cannot be followed: it is reported instead
    _, unaccounted = graph(root, {})
    assert unaccounted == {"pkg.registry": [4]}


def test_every_dynamic_import_is_accounted_for():
    _, unaccounted = graph()
    assert not unaccounted, (
        f"import_module with a computed name in {unaccounted} (module: lines): list its table "
        f"in TABLES so that its arrows are drawn"
    )


def test_posenc_has_no_import_cycles():
    edges, _ = graph()
    assert "posenc.scheme" in edges and "posenc.rope" in edges["posenc.multidim"]
    # the deferred and table-driven arrows are in the graph
    assert {"posenc.rope", "posenc.alibi"} <= edges["posenc.registry"]
    assert {"posenc.analysis", "posenc.viz"} <= edges["posenc"]
    assert "posenc.hf" not in edges["posenc.scaling"]
    cycle = find_cycle(_without(edges, ALLOWED))
    assert cycle is None, " -> ".join(cycle)


def test_each_allowed_arrow_is_still_needed():
    edges, _ = graph()
    for arrow, why in ALLOWED.items():
        assert arrow[1] in edges[arrow[0]], f"{arrow} is no longer an import: drop it ({why})"
        others = _without(edges, set(ALLOWED) - {arrow})
        assert find_cycle(others) is not None, f"{arrow} closes no circle: drop it ({why})"


def test_no_scheme_module_imports_the_registry():
    """The registry imports every scheme module: none may import it back."""
    edges, _ = graph()
    schemes = {c.__module__ for c in posenc.SCHEMES.values()} - {"posenc.scheme"}
    for name in schemes:
        assert "posenc.registry" not in edges[name], name


def test_the_core_never_imports_a_scheme_module():
    """flex, the entry point, the contract and the helpers know no scheme by name."""
    edges, _ = graph()
    schemes = {c.__module__ for c in posenc.SCHEMES.values()} - {"posenc.scheme"}
    core = ("flex", "attend", "scheme", "context", "masks", "sdpa", "kv_cache")
    for name in core:
        assert not edges[f"posenc.{name}"] & schemes, name
    # the registry imports them all, by design (its table), and nothing else in the core
    assert edges["posenc.registry"] & schemes == schemes
