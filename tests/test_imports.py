"""The package has no import cycles: every module's imports (at any depth) form a DAG.

Imports are read with ``ast`` from the source, including imports inside
functions (a deferred import still ties two modules together), so the layout
stays what the design says: contract and registry, masks, the attention entry
point, flex, the kernels, and the scheme modules on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import posenc

ROOT = Path(posenc.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known}
    return found - {name}


def graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    known = set(files)
    edges = {name: _imports(path, name, known) for name, path in files.items()}
    # importing a submodule runs its package's __init__ first: not an edge of the design
    return {
        n: {t for t in ts if not n.startswith(t + ".") and t != "posenc"} for n, ts in edges.items()
    }


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


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_posenc_has_no_import_cycles():
    edges = graph()
    assert "posenc.scheme" in edges and "posenc.rope" in edges["posenc.multidim"]
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_the_core_never_imports_a_scheme_module():
    """flex, the entry point, the contract and the helpers know no scheme by name."""
    edges = graph()
    schemes = {c.__module__ for c in posenc.SCHEMES.values()} - {"posenc.scheme"}
    core = ("flex", "attend", "scheme", "context", "masks", "sdpa", "kv_cache", "registry")
    for name in core:
        assert not edges[f"posenc.{name}"] & schemes, name
