"""One public surface: ``posenc.__all__`` and ``posenc.lab.__all__`` (issue 28, item 2).

- ``posenc.__all__`` is exactly the union of its modules' ``__all__``, and what
  ``from posenc import *`` and ``dir(posenc)`` give; every registered scheme is in it.
- Every public name has a docstring with a one-line summary, a ``Parameters`` section
  naming each parameter of its signature and, for a function that returns something,
  a ``Returns`` section.  Module-level constants have a ``#:`` comment where they are
  defined (what the reference shows for them).
- The reference (``book/reference/*.rst``) documents every public name and nothing
  else, and each scheme's entry links to the chapter that derives it.

The built site is checked too: ``tests/test_site.py`` (every entry rendered with its
signature) and ``book/_ext/posenc_reference.py`` (the strict build fails on a missing
or extra entry and on an unresolved reference to a posenc name).
"""

from __future__ import annotations

import ast
import inspect
import json
import pkgutil
import re
import sys
from pathlib import Path

import posenc
import posenc.lab

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "book" / "reference"
NAMESPACES = (posenc, posenc.lab)
# Submodules of posenc that are not part of its API: the book's derivation and plotting
# helpers (posenc.analysis, posenc.viz) and the lab, which has its own __all__.
NOT_EXPORTED = {"analysis", "viz", "lab"}

# Public names whose docstring lacks a required part (what it lacks).  The test fails
# when a name here is complete (remove it) and when a name outside it is not.  None is
# left.  (The four names of the frozen posenc/lab/propositions.py are exported through
# posenc/lab/verdicts.py, which documents them without touching the hashed file.)
PENDING: dict[str, str] = {}


def public() -> list[tuple[str, object]]:
    """(qualified name, object) of every name in the two ``__all__`` lists."""
    return [(f"{ns.__name__}.{n}", getattr(ns, n)) for ns in NAMESPACES for n in ns.__all__]


# --------------------------------------------------------------------------- surface


def test_all_lists_each_name_once_and_every_name_exists():
    for namespace in NAMESPACES:
        names = namespace.__all__
        assert len(names) == len(set(names)), namespace.__name__
        missing = [n for n in names if not hasattr(namespace, n)]
        assert not missing, f"{namespace.__name__}.__all__ names what it lacks: {missing}"


def test_posenc_all_is_exactly_what_its_modules_export():
    exported = {}
    for info in pkgutil.iter_modules(posenc.__path__):
        if info.name.startswith("_") or info.name in NOT_EXPORTED:
            continue
        module = __import__(f"posenc.{info.name}", fromlist=["__all__"])
        assert hasattr(module, "__all__"), f"posenc.{info.name} has no __all__"
        for name in module.__all__:
            exported[name] = module.__name__
    assert set(posenc.__all__) == set(exported), (
        f"in a module's __all__ but not in posenc.__all__: "
        f"{sorted(set(exported) - set(posenc.__all__))}; "
        f"in posenc.__all__ only: {sorted(set(posenc.__all__) - set(exported))}"
    )
    for name, module in exported.items():
        assert getattr(posenc, name) is getattr(__import__(module, fromlist=[name]), name), name


def test_star_import_and_dir_give_the_public_api():
    names: dict = {}
    exec("from posenc import *", names)  # noqa: S102
    assert set(names) - {"__builtins__"} == set(posenc.__all__)
    shown = set(dir(posenc))
    assert set(posenc.__all__) <= shown
    # no module that a name happens to be defined in, no helper import
    assert shown - set(posenc.__all__) == {"__version__", "analysis", "viz"}, sorted(shown)


def test_every_registered_scheme_is_public():
    for name, cls in posenc.SCHEMES.items():
        assert cls.__name__ in posenc.__all__, name
        assert getattr(posenc, cls.__name__) is cls, name


def test_version_is_the_one_pyproject_reads():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', text, re.M), "pyproject writes its own version"
    assert 'version = { attr = "posenc.__version__" }' in text
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", posenc.__version__)
    # setuptools reads it without importing the package (no torch at build time): a literal
    tree = ast.parse((ROOT / "posenc" / "__init__.py").read_text())
    literal = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["__version__"]
        and isinstance(node.value, ast.Constant)
    ]
    assert literal == [posenc.__version__]


def test_changelog_heads_with_the_next_release_or_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert releases, "CHANGELOG.md has no release headings"
    assert releases[0] in ("Unreleased", posenc.__version__), releases[0]
    for heading in re.findall(r"^### (.+)$", text, re.M):
        assert heading in ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")


# ------------------------------------------------------------------------ docstrings


def _section_names(doc: str) -> dict[str, list[str]]:
    """numpydoc sections of ``doc``: title -> the lines of its body."""
    lines = doc.splitlines()
    sections, current = {}, None
    for i, line in enumerate(lines):
        underline = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and re.fullmatch(r"-{3,}", underline.strip()):
            current = line.strip()
            sections[current] = []
        elif current is not None and not re.fullmatch(r"-{3,}", line.strip()):
            sections[current].append(line)
    return sections


def _documented_parameters(body: list[str]) -> set[str]:
    indent = min((len(x) - len(x.lstrip()) for x in body if x.strip()), default=0)
    names = set()
    for line in body:
        if line.strip() and len(line) - len(line.lstrip()) == indent:
            head = line.strip().split(" : ")[0]
            names |= {n.strip().lstrip("*") for n in head.split(",")}
    return names


def _comment_above(module, name: str) -> str | None:
    """The ``#:`` comment lines right above ``name = ...`` in ``module``'s source."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return None
    lines = source.splitlines()
    for node in ast.parse(source).body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = [getattr(t, "id", None) for t in node.targets]
        elif isinstance(node, ast.AnnAssign):
            targets = [getattr(node.target, "id", None)]
        if name in targets:
            comments, row = [], node.lineno - 2
            while row >= 0 and lines[row].lstrip().startswith("#:"):
                comments.insert(0, lines[row].lstrip()[2:].strip())
                row -= 1
            return " ".join(comments) or None
    return None


def _constant_doc(namespace, name: str) -> str | None:
    value = getattr(namespace, name)
    for modname, module in sorted(sys.modules.items()):
        if module is None or not (modname == namespace.__name__ or modname.startswith("posenc.")):
            continue
        if getattr(module, name, None) is value:
            comment = _comment_above(module, name)
            if comment:
                return comment
    return None


def _is_record(cls) -> bool:
    """A NamedTuple or dataclass: its fields are its constructor's parameters."""
    return hasattr(cls, "_fields") or hasattr(cls, "__dataclass_fields__")


def problems(qualname: str, obj) -> list[str]:
    """What the docstring of a public name lacks (empty when complete)."""
    namespace, _, name = qualname.rpartition(".")
    if not (inspect.isclass(obj) or inspect.isroutine(obj)):
        return [] if _constant_doc(__import__(namespace, fromlist=[name]), name) else ["no #:"]
    own = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    doc = inspect.cleandoc(own or "")
    found = []
    paragraphs = doc.split("\n\n")
    if not doc or "\n" in paragraphs[0].strip():
        found.append("summary is not one line")
    sections = _section_names(doc)
    if inspect.isclass(obj) and "__init__" in obj.__dict__:
        init_doc = inspect.cleandoc(obj.__init__.__doc__ or "")
        sections = {**_section_names(init_doc), **sections}
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        signature = None
    params = [
        p.name
        for p in (signature.parameters.values() if signature else [])
        if p.name not in ("self", "cls")
    ]
    if inspect.isclass(obj):
        # a class whose constructor is torch's (nn.Module(*args, **kwargs)) takes nothing
        maker = next(c for c in obj.__mro__ if "__init__" in c.__dict__ or "__new__" in c.__dict__)
        if not (maker.__module__ or "").startswith("posenc") and not _is_record(obj):
            params = []
    if params:
        body = sections.get("Parameters", [])
        if inspect.isclass(obj):
            body = body + sections.get("Attributes", [])
        if not body:
            found.append("no Parameters section")
        else:
            undocumented = [p for p in params if p not in _documented_parameters(body)]
            if undocumented:
                found.append(f"parameters not documented: {', '.join(undocumented)}")
    if not inspect.isclass(obj) and signature is not None:
        annotation = signature.return_annotation
        returns_none = annotation in (None, "None")
        if not returns_none and "Returns" not in sections and "Yields" not in sections:
            found.append("no Returns section")
    return found


def test_pending_list_is_exact():
    """Every public docstring is complete, except the names of :data:`PENDING`."""
    failing = {q: problems(q, obj) for q, obj in public()}
    failing = {q: p for q, p in failing.items() if p}
    fixed = sorted(set(PENDING) - set(failing))
    new = {q: p for q, p in failing.items() if q not in PENDING}
    assert not new, "incomplete docstrings:\n" + "\n".join(f"{q}: {p}" for q, p in new.items())
    assert not fixed, f"complete now, remove from PENDING: {fixed}"


def test_problems_sees_each_kind_of_gap():
    def bare(x, y):
        """Two lines
        of summary."""

    def full(x, *, y=1) -> int:
        """Add.

        Parameters
        ----------
        x, y
            Numbers.

        Returns
        -------
        Their sum.
        """

    def half(x, y) -> int:
        """Add.

        Parameters
        ----------
        x : int
            A number.
        """

    assert problems("m.bare", bare) == [
        "summary is not one line",
        "no Parameters section",
        "no Returns section",
    ]
    assert problems("m.full", full) == []
    assert problems("m.half", half) == ["parameters not documented: y", "no Returns section"]


# ------------------------------------------------------------------------- reference

# the name ends at a space or at an explicit signature: ``.. autoclass:: LayerSpec(...)``
_DIRECTIVE = re.compile(r"^\.\. (currentmodule|automodule|auto\w+):: ([^\s(]+)", re.M)


def reference_entries() -> dict[str, tuple[str, str]]:
    """Qualified name -> (page, directive body) of every ``auto*`` entry in the reference."""
    entries = {}
    for page in sorted(REFERENCE.glob("*.rst")):
        text = page.read_text()
        module = "posenc"
        matches = list(_DIRECTIVE.finditer(text))
        for i, match in enumerate(matches):
            kind, name = match.groups()
            if kind in ("currentmodule", "automodule"):
                module = name
                if kind == "automodule":
                    entries[name] = (page.name, "")
                continue
            if kind == "autosummary" or not kind.startswith("auto"):
                continue
            end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
            body = text[match.end() : end]
            qualified = name if name.startswith("posenc.") else f"{module}.{name}"
            assert qualified not in entries, f"{qualified} documented twice"
            entries[qualified] = (page.name, body)
    return entries


def test_reference_documents_every_public_name_and_nothing_else():
    documented = set(reference_entries()) - {"posenc", "posenc.lab"}
    names = {q for q, _ in public()}
    assert not names - documented, f"public but not in the reference: {sorted(names - documented)}"
    assert not documented - names, f"in the reference, not public: {sorted(documented - names)}"


def test_reference_pages_are_in_the_table_of_contents():
    toc = (ROOT / "_toc.yml").read_text()
    for page in REFERENCE.glob("*.rst"):
        assert f"file: book/reference/{page.stem}\n" in toc, page.name


def _chapter_labels() -> set[str]:
    labels = set()
    for chapter in (ROOT / "book").glob("*.ipynb"):
        for cell in json.loads(chapter.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                labels |= set(re.findall(r"^\(([\w-]+)\)=", "".join(cell["source"]), re.M))
    for page in (ROOT / "book").glob("*.md"):
        labels |= set(re.findall(r"^\(([\w-]+)\)=", page.read_text(), re.M))
    return labels


def test_each_scheme_entry_links_to_the_chapter_that_derives_it():
    entries, labels = reference_entries(), _chapter_labels()
    for cls in posenc.SCHEMES.values():
        page, body = entries[f"posenc.{cls.__name__}"]
        refs = re.findall(r":ref:`([\w-]+)`", body)
        assert refs, f"{cls.__name__} ({page}) links to no chapter"
        assert set(refs) <= labels, f"{cls.__name__}: no such chapter label {set(refs) - labels}"
