"""sphinx-proof's index of statements, readable and listed in the book's sidebar.

sphinx-proof writes ``prf-prf.html``, a Sphinx domain index of every labelled
definition, proposition, theorem and remark.  Its own index lists the bare labels
(``prop-rope-layouts``), one heading per label.  This extension
- lists the statements chapter by chapter instead, in the order of the text, each named
  as the text numbers it ("Proposition 9.4") with its title (or, for an untitled one,
  the opening words), under a link to its chapter;
- lets the sidebar link to the index.  A toctree may name a generated page only if
  Sphinx knows it (``genindex``, ``modindex`` and ``search``), and ``_toc.yml`` holds
  either a page of the book or an absolute URL, which would break the offline site.  So
  ``_toc.yml`` names the index with the placeholder ``url: index://prf-prf``; the
  extension registers ``prf-prf`` as a generated page, as ``genindex`` is, and rewrites
  the placeholder before the toctrees are collected, so every page links to
  ``prf-prf.html`` relative to itself.
"""

import re

from docutils import nodes
from sphinx import addnodes
from sphinx.domains import IndexEntry
from sphinx.domains.std import StandardDomain
from sphinx_proof.domain import ProofDomain, ProofIndex

SCHEME = "index://"
INDEX_TITLE = "Index of statements"
GENERATED = {"prf-prf": INDEX_TITLE}

# Titles are Markdown with a little math ("ratio $b^{2/d}$"); the index prints plain text.
_GREEK = {
    name: chr(code)
    for name, code in [
        ("alpha", 0x3B1), ("beta", 0x3B2), ("gamma", 0x3B3), ("delta", 0x3B4),
        ("varepsilon", 0x3B5), ("epsilon", 0x3B5), ("theta", 0x3B8), ("lambda", 0x3BB),
        ("mu", 0x3BC), ("pi", 0x3C0), ("rho", 0x3C1), ("sigma", 0x3C3), ("tau", 0x3C4),
        ("phi", 0x3C6), ("omega", 0x3C9), ("Delta", 0x394), ("Theta", 0x398),
        ("Pi", 0x3A0), ("Sigma", 0x3A3), ("le", 0x2264), ("leq", 0x2264), ("ge", 0x2265),
        ("geq", 0x2265), ("neq", 0x2260), ("ne", 0x2260), ("approx", 0x2248),
        ("to", 0x2192), ("infty", 0x221E), ("cdot", 0xB7), ("dots", 0x2026),
        ("ldots", 0x2026), ("times", 0xD7), ("in", 0x2208), ("lvert", 0x7C), ("rvert", 0x7C),
    ]
}  # fmt: skip
_SPACING = {",", ";", "!", " ", "quad", "qquad"}


def plain_tex(tex):
    """TeX as plain text: ``\\omega_i`` -> ``ω_i``, ``b^{2/d}`` -> ``b^(2/d)``."""

    def command(match):
        name = match.group(1)
        if name in _SPACING:
            return " "
        return _GREEK.get(name, "")  # \\operatorname, \\mathrm, \\boldsymbol: keep the argument

    text = re.sub(r"\\([A-Za-z]+|[,;! ])", command, tex)
    text = re.sub(r"([_^])\{([^{}]*)\}", lambda m: f"{m.group(1)}({m.group(2)})", text)
    text = re.sub(r"[{}]", "", text)
    return re.sub(r"\s+", " ", text).strip()


def plain_title(title):
    """A statement title as plain text, without sphinx-proof's parentheses."""
    text = title.strip()
    if text.startswith("(") and text.endswith(")"):  # sphinx-proof's " (%t)" title format
        text = text[1:-1]
    return plain_tex(text.replace("$", ""))


def first_words(node, limit=90):
    """The opening of a statement's first paragraph, math written as plain text."""
    paragraph = next(iter(node.findall(nodes.paragraph)), None)
    if paragraph is None:
        return ""
    parts = []
    for child in paragraph.findall(lambda n: isinstance(n, (nodes.Text, nodes.math))):
        if isinstance(child, nodes.math):
            parts.append(plain_tex(child.astext()))
        elif not isinstance(child.parent, nodes.math):
            parts.append(str(child))
    text = re.sub(r"\s+", " ", "".join(parts)).strip()
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " …"


class StatementIndex(ProofIndex):
    """Statements by chapter, numbered as in the text, with their titles."""

    localname = INDEX_TITLE

    def generate(self, docnames=None):
        env = self.domain.env
        statements = getattr(env, "proof_list", {})
        titles = getattr(env, "posenc_statement_titles", {})
        by_chapter = {}
        for label, info in statements.items():
            docname = info["docname"]
            if docnames and docname not in docnames:
                continue
            number = ()
            if not info["nonumber"]:
                number = env.toc_fignumbers.get(docname, {}).get(info["countertype"], {})
                number = number.get(label, ())
            name = f"{info['realtype'].title()} {'.'.join(map(str, number))}".strip()
            place, title = titles.get(label, (0, ""))
            entry = IndexEntry(name, 2, docname, label, "", "", title)
            by_chapter.setdefault(docname, []).append((place, label, entry))
        content = []
        for docname, entries in by_chapter.items():
            chapter = env.toc_secnumbers.get(docname, {}).get("", ())
            title = env.titles[docname].astext() if docname in env.titles else docname
            key = ".".join(map(str, chapter)) or title
            heading = f"{key}. {title}" if chapter else title
            rows = [IndexEntry(heading, 0, docname, "", "", "", "")]  # 1 would add a toggler
            rows += [entry for _, _, entry in sorted(entries)]
            content.append((chapter or (10**6,), key, rows))
        content.sort(key=lambda item: (item[0], item[1]))
        return [(key, rows) for _, key, rows in content], False


def _register_generated_pages(app):
    for name, title in GENERATED.items():
        StandardDomain._virtual_doc_names.setdefault(name, (name, title))


def _collect(app, doctree):
    """Note each statement's title and place, and point ``index://`` entries at the index."""
    titles = app.env.__dict__.setdefault("posenc_statement_titles", {})
    statements = doctree.findall(lambda n: "realtype" in getattr(n, "attributes", {}))
    for place, node in enumerate(statements):
        if node.get("label"):
            title = plain_title(node.get("title", "")) or first_words(node)
            titles[node["label"]] = (place, title)
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


def _merge(app, env, docnames, other):
    env.__dict__.setdefault("posenc_statement_titles", {}).update(
        getattr(other, "posenc_statement_titles", {})
    )


def setup(app):
    ProofDomain.indices = [StatementIndex]
    app.connect("builder-inited", _register_generated_pages)
    # Before Sphinx's toctree collector (priority 500) copies the toctrees.
    app.connect("doctree-read", _collect, priority=400)
    app.connect("env-merge-info", _merge)
    # env_version: a saved environment from before the titles were collected is re-read.
    return {"env_version": 2, "parallel_read_safe": True, "parallel_write_safe": True}
