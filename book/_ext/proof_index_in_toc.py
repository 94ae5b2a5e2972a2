"""List sphinx-proof's index of statements in the book's sidebar.

sphinx-proof writes ``prf-prf.html``, a Sphinx domain index of every definition,
proposition, theorem and remark with a label.  A toctree may name a generated page only
if Sphinx knows it (``genindex``, ``modindex`` and ``search``), and ``_toc.yml`` holds
either a page of the book or an absolute URL, which would break the offline site.

So ``_toc.yml`` names the index with the placeholder ``url: index://prf-prf``, and this
extension
- registers ``prf-prf`` with the standard domain as a generated page, as ``genindex`` is;
- rewrites each ``index://<name>`` toctree entry to the page ``<name>`` before the
  toctrees are collected, so the sidebar links to ``prf-prf.html`` relative to each page.
"""

from sphinx import addnodes
from sphinx.domains.std import StandardDomain

SCHEME = "index://"
GENERATED = {"prf-prf": "Index of statements"}


def _register_generated_pages(app):
    for name, title in GENERATED.items():
        StandardDomain._virtual_doc_names.setdefault(name, (name, title))


def _point_entries_at_generated_pages(app, doctree):
    for toctree in doctree.findall(addnodes.toctree):
        entries = []
        for title, ref in toctree["entries"]:
            if ref.startswith(SCHEME):
                name = ref.removeprefix(SCHEME)
                if name not in GENERATED:
                    raise ValueError(f"_toc.yml: unknown generated page {ref!r}")
                ref = name
            entries.append((title, ref))
        toctree["entries"] = entries


def setup(app):
    app.connect("builder-inited", _register_generated_pages)
    # Before Sphinx's toctree collector (priority 500) copies the toctrees.
    app.connect("doctree-read", _point_entries_at_generated_pages, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
