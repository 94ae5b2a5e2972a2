"""The API reference (``book/reference/``): what it documents, and its cross-references.

The pages list their names by hand, grouped as a user looks for them; this extension
holds them to the public surface, ``posenc.__all__`` and ``posenc.lab.__all__``:

- every name of the two ``__all__`` lists has an entry (``autofunction``, ``autoclass``,
  ``autodata``), and nothing else is documented at module level under ``posenc``
  (members of a documented class are part of its entry);
- a module-level constant documented as ``posenc.SCHEMES`` gets the ``#:`` comment
  written beside its definition in the module that owns it (``posenc.registry``), not
  the docstring of ``dict``;
- ``:mod:`posenc.flex``` and the like land on the reference section of that module's
  public names, labelled ``api-flex`` (``api-lab-experiments`` for
  ``posenc.lab.experiments``): the submodules are not documented as namespaces of
  their own;
- a reference to another library (``torch.Tensor`` in a signature) is rendered as
  plain text: the build fetches no inventory, so it cannot link there.

A reference to a posenc name that does not resolve stays a warning, which the strict
build (``-n -W``) turns into an error.  Each of these checks warns, so a page that
misses a name, or documents a private one, fails ``make book``.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging as logging_module
import sys

from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging
from sphinx.util.nodes import make_refnode

logger = logging.getLogger(__name__)

# The namespaces whose ``__all__`` is the public API, and the modules documented as such.
PUBLIC = ("posenc", "posenc.lab")


def public_names() -> dict[str, str]:
    """Qualified name -> namespace, for every name in the ``__all__`` of :data:`PUBLIC`."""
    names = {}
    for namespace in PUBLIC:
        for name in importlib.import_module(namespace).__all__:
            names[f"{namespace}.{name}"] = namespace
    return names


def module_label(target: str) -> str:
    """The label of a posenc module's reference section: ``posenc.lab.run`` -> ``api-lab-run``."""
    return "api-" + target.removeprefix("posenc.").replace(".", "-").replace("_", "-").lower()


def _owner_comment(namespace: str, name: str) -> list[str] | None:
    """The ``#:`` comment beside the definition of ``namespace.name``, in its own module."""
    value = getattr(importlib.import_module(namespace), name)
    for modname in sorted(m for m in sys.modules if m == namespace or m.startswith("posenc.")):
        module = sys.modules[modname]
        if module is None or getattr(module, name, None) is not value:
            continue
        try:
            docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
        except Exception:  # noqa: BLE001 (a module without source: look elsewhere)
            continue
        if ("", name) in docs:
            return list(docs[("", name)])
    return None


def _data_docstring(app, what, name, obj, options, lines):
    if what != "data" or not name.startswith("posenc."):
        return
    namespace, _, short = name.rpartition(".")
    comment = _owner_comment(namespace, short)
    lines[:] = comment if comment is not None else []


# Napoleon reads the first line of an attribute's or property's docstring as
# "type: description" (a Google-style convention): "Rows of every learned table: the
# longest ..." became a type.  numpydoc has no such form, so these docstrings are kept
# as written: saved before napoleon runs (priority 400 < its 500), restored after.
_ATTRIBUTE_KINDS = ("attribute", "data", "property")


def _save_attribute_docstring(app, what, name, obj, options, lines):
    if what in _ATTRIBUTE_KINDS and name.startswith("posenc."):
        app.env.temp_data.setdefault("posenc_attribute_lines", {})[name] = list(lines)


def _restore_attribute_docstring(app, what, name, obj, options, lines):
    saved = app.env.temp_data.get("posenc_attribute_lines", {}).pop(name, None)
    if what in _ATTRIBUTE_KINDS and saved is not None:
        lines[:] = saved


def _lookup(path: str):
    """The Python object a dotted posenc path names, or ``None``."""
    parts = path.split(".")
    if parts[0] != "posenc":
        return None
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _key(obj):
    return id(getattr(obj, "__func__", obj))


def _documented_objects(env) -> dict:
    """id of a documented Python object -> its entry's name (built once per build)."""
    objects = env.get_domain("py").objects
    cache = env.temp_data.get("posenc_documented")
    if cache is None or cache[0] != len(objects):
        by_id = {}
        for name, entry in objects.items():
            if entry.aliased or entry.objtype == "module" or not name.startswith("posenc"):
                continue
            obj = _lookup(name)
            if obj is not None and not isinstance(obj, (int, float, str, bool, type(None))):
                by_id.setdefault(_key(obj), name)
        cache = (len(objects), by_id)
        env.temp_data["posenc_documented"] = cache
    return cache[1]


def _same_object(env, node) -> str | None:
    """The documented name of the object a posenc reference names under another path.

    ``posenc.hf.rope_scaling_from_transformers`` is ``posenc.rope_scaling_from_transformers``;
    ``:meth:`rotate``` in a docstring of :class:`posenc.ShawRelativeAttention` is the
    inherited ``posenc.PositionalScheme.rotate``.  Only the same Python object counts.
    """
    target = node.get("reftarget", "").lstrip("~.")
    module, cls = node.get("py:module"), node.get("py:class")
    contexts = [c for c in (module and cls and f"{module}.{cls}", module) if c] + [""]
    documented = _documented_objects(env)
    for context in contexts:
        obj = _lookup(f"{context}.{target}" if context else target)
        if obj is not None and not isinstance(obj, (int, float, str, bool, type(None))):
            name = documented.get(_key(obj))
            if name is not None:
                return name
    return None


def _external(target: str) -> bool:
    head = target.lstrip("~.").split(".")[0]
    if head == "posenc" or not head.isidentifier():
        return False
    try:
        return importlib.util.find_spec(head) is not None
    except (ImportError, ValueError):
        return False


def _missing_reference(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if node.get("reftype") == "mod":
        if not target.startswith("posenc."):
            return contnode if _external(target) else None
        found = env.domaindata["std"]["anonlabels"].get(module_label(target))
        if found is None:
            return None
        docname, labelid = found
        return make_refnode(app.builder, node["refdoc"], docname, labelid, contnode, target)
    name = _same_object(env, node)
    if name is not None:
        entry = env.get_domain("py").objects[name]
        docname, node_id = entry.docname, entry.node_id
        return make_refnode(app.builder, node["refdoc"], docname, node_id, contnode, name)
    if _external(target):
        return contnode
    return None


def _check_public_surface(app, env):
    objects = env.get_domain("py").objects
    expected = public_names()
    missing = sorted(set(expected) - set(objects))
    for name in missing:
        logger.warning(
            f"{name} is in {expected[name]}.__all__ but has no entry in the reference",
            type="posenc",
            subtype="api",
        )
    classes = {n for n, e in objects.items() if e.objtype in ("class", "exception")}
    for name, entry in sorted(objects.items()):
        if entry.aliased or not name.startswith("posenc"):
            continue
        if entry.objtype == "module":
            if name not in PUBLIC:
                logger.warning(
                    f"module {name} is documented; only {', '.join(PUBLIC)} are",
                    location=(entry.docname, None),
                    type="posenc",
                    subtype="api",
                )
            continue
        if name in expected or name.rpartition(".")[0] in classes:
            continue
        logger.warning(
            f"{name} is documented but is not in the __all__ of {', '.join(PUBLIC)}",
            location=(entry.docname, None),
            type="posenc",
            subtype="api",
        )


# Defects of library docstrings that the reference shows, each to be fixed in the module
# that owns the docstring (issue 28, phase 2).  Each entry is (where the warning comes
# from, what it says): only a warning that matches both is held back, and it is still
# printed, as "pending", in the build's output.  Any other warning fails the build.
# None is left: every warning from a docstring fails the build.
PENDING_DOCSTRING_FIXES: tuple[tuple[str, str], ...] = ()


def _where(record) -> str:
    """Where a warning comes from: its source, and the entry it sits in (``entry posenc.XPos``)."""
    location = getattr(record, "location", None)
    if location is None or isinstance(location, (str, tuple)):
        return str(location or "")
    source = getattr(location, "source", None)
    if source is None and getattr(location, "document", None) is not None:
        source = location.document.get("source")
    entry, node = "", location
    while node is not None and not entry:
        if getattr(node, "tagname", "") == "desc" and node.children:
            entry = " ".join(node.children[0].get("ids", []))
        node = getattr(node, "parent", None)
    return f"{source or ''} entry {entry}".strip()


class _PendingFixes(logging_module.Filter):
    """Hold back the warnings of :data:`PENDING_DOCSTRING_FIXES`; print them as pending."""

    def __init__(self, app):
        super().__init__()
        self.app = app
        self.held = []

    def filter(self, record):
        if record.levelno < logging_module.WARNING:
            return True
        message, where = record.getMessage(), _where(record)
        for place, text in PENDING_DOCSTRING_FIXES:
            if place in where and text in message:
                self.held.append(f"{where}: {message}")
                return False
        return True


def _install_filter(app):
    pending = _PendingFixes(app)
    app.posenc_pending = pending
    for handler in logging_module.getLogger("sphinx").handlers:
        if handler.level >= logging_module.WARNING or "Warning" in type(handler).__name__:
            handler.filters.insert(0, pending)


def _report_pending(app, exception):
    held = sorted(set(app.posenc_pending.held))
    if held:
        logger.info(f"posenc reference: {len(held)} docstring defects pending (issue 28):")
        for line in held:
            logger.info(f"  pending: {line}")


def setup(app):
    _install_filter(app)
    app.connect("build-finished", _report_pending)
    app.connect("autodoc-process-docstring", _save_attribute_docstring, priority=400)
    app.connect("autodoc-process-docstring", _restore_attribute_docstring, priority=600)
    app.connect("autodoc-process-docstring", _data_docstring, priority=700)
    app.connect("missing-reference", _missing_reference)
    app.connect("env-check-consistency", _check_public_surface)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
