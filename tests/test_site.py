"""The built site works offline: nothing is loaded from another host, and math is local.

Run after the book is built (``make site`` builds it first).  Links (``<a href>``) may
point anywhere; only what a browser *fetches* to render a page is checked: scripts,
stylesheets, images, media, iframes, and ``url(...)``/``@import`` inside CSS.
"""

import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Another built copy (one built with --path-output) can be checked with POSENC_SITE.
SITE = Path(os.environ.get("POSENC_SITE", ROOT / "_build" / "html")).resolve()

# (tag, attribute) pairs whose URL the browser loads while rendering.
_FETCHED = {
    ("script", "src"),
    ("img", "src"),
    ("img", "srcset"),
    ("source", "src"),
    ("source", "srcset"),
    ("video", "src"),
    ("audio", "src"),
    ("iframe", "src"),
    ("embed", "src"),
    ("object", "data"),
    ("input", "src"),
}
_REMOTE = re.compile(r"^\s*(?:[a-z][a-z0-9+.\-]*:)?//", re.IGNORECASE)
_CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]""")


class _Fetches(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for t, attr in _FETCHED:
            if t == tag and attrs.get(attr):
                self.urls.extend(u.split()[0] for u in attrs[attr].split(","))
        if tag == "link" and attrs.get("href"):
            rel = (attrs.get("rel") or "").lower()
            if any(
                r in rel for r in ("stylesheet", "icon", "preload", "modulepreload", "manifest")
            ):
                self.urls.append(attrs["href"])
        if attrs.get("style"):
            self.urls.extend(a or b for a, b in _CSS_URL.findall(attrs["style"]))


def _pages():
    if not SITE.is_dir():
        pytest.fail(f"no built site at {SITE}: run `make book` first")
    return sorted(SITE.rglob("*.html"))


def _remote(urls):
    return sorted({u for u in urls if _REMOTE.match(u) and not u.startswith("data:")})


def test_is_remote_recognises_what_a_browser_fetches_elsewhere():
    # Guard the scanner itself: these are exactly the forms that broke offline reading.
    parser = _Fetches()
    parser.feed(
        '<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"></script>'
        '<link rel="stylesheet" href="//fonts.googleapis.com/css">'
        '<img src="_images/fig.png"><a href="https://arxiv.org">paper</a>'
    )
    assert _remote(parser.urls) == [
        "//fonts.googleapis.com/css",
        "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js",
    ]


def test_html_loads_nothing_from_another_host():
    offenders = {}
    for page in _pages():
        parser = _Fetches()
        parser.feed(page.read_text(encoding="utf-8"))
        inline_css = "".join(re.findall(r"<style[^>]*>(.*?)</style>", page.read_text(), re.S))
        urls = parser.urls + [a or b for a, b in _CSS_URL.findall(inline_css)]
        remote = _remote(urls)
        if remote:
            offenders[page.relative_to(SITE).as_posix()] = remote
    assert not offenders, offenders


def test_stylesheets_load_nothing_from_another_host():
    offenders = {}
    for css in sorted(SITE.rglob("*.css")):
        remote = _remote(a or b for a, b in _CSS_URL.findall(css.read_text(errors="replace")))
        if remote:
            offenders[css.relative_to(SITE).as_posix()] = remote
    assert not offenders, offenders


def test_mathjax_is_shipped_and_used_by_every_page_with_math():
    assert (SITE / "_static" / "mathjax" / "tex-chtml.js").is_file()
    assert any((SITE / "_static" / "mathjax" / "output" / "chtml" / "fonts").rglob("*.woff"))
    pages_with_math = 0
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        if 'class="math' in text:
            pages_with_math += 1
            assert "_static/mathjax/tex-chtml.js" in text, page
    assert pages_with_math >= 1


def test_every_chapter_is_built_with_its_figures():
    toc = (Path(__file__).resolve().parents[1] / "_toc.yml").read_text()
    chapters = re.findall(r"file:\s*(book/\S+)", toc)
    assert chapters
    for chapter in chapters:
        page = SITE / f"{chapter}.html"
        assert page.is_file(), f"{chapter} was not built"
        for src in re.findall(r'<img[^>]+src="([^"]+)"', page.read_text(encoding="utf-8")):
            assert (page.parent / src).resolve().is_file(), f"{chapter}: missing image {src}"


def test_bibliography_page_lists_cited_works():
    text = (SITE / "book" / "bibliography.html").read_text(encoding="utf-8")
    assert "Vaswani" in text


def test_each_inline_script_appears_once_per_page():
    # Sphinx 7.4 emitted sphinx-thebe's `const THEBE_JS_URL = ...` twice: a SyntaxError
    # on every page.  book/_ext/single_inline_scripts.py keeps one copy.
    offenders = {}
    for page in _pages():
        bodies = re.findall(r"<script>(.*?)</script>", page.read_text(encoding="utf-8"), re.S)
        repeated = sorted({b.strip()[:60] for b in bodies if bodies.count(b) > 1})
        if repeated:
            offenders[page.relative_to(SITE).as_posix()] = repeated
    assert not offenders, offenders


def test_bibliography_labels_are_author_year_like_the_citations():
    text = (SITE / "book" / "bibliography.html").read_text(encoding="utf-8")
    labels = re.findall(r'<span class="fn-bracket">\[</span>(.*?)<span class="fn-bracket">', text)
    assert len(labels) >= 10, labels
    for label in labels:
        assert re.fullmatch(r"[^\[\]]+, (\d{4}[a-z]?|n\.d\.)", label), label
    authors = [label.rsplit(", ", 1)[0].lower() for label in labels]
    assert authors == sorted(authors), "entries are not in alphabetical order of author"
    assert "Anonymous" not in text


# Sources whose address we could not establish; every other entry links to its source.
_NO_KNOWN_ADDRESS = {"canal2024understanding", "notes2024positional"}


def test_every_bibliography_entry_links_to_its_source():
    bib = (Path(__file__).resolve().parents[1] / "references.bib").read_text(encoding="utf-8")
    entries = re.findall(r"@(\w+)\{([^,]+),(.*?)\n\}", bib, re.S)
    assert entries
    missing = [
        key
        for kind, key, body in entries
        if kind.lower() != "book"
        and key not in _NO_KNOWN_ADDRESS
        and not re.search(r"^\s*(url|doi|eprint)\s*=|\\url\{", body, re.M)
    ]
    assert not missing, f"entries without url, doi or eprint: {missing}"


def test_every_chapter_has_colab_and_binder_launch_links():
    # The THEBE_JS_URL fix (book/_ext/single_inline_scripts.py) must leave these alone.
    # Notebooks only: the Markdown pages (notation, bibliography) have nothing to run.
    toc = (ROOT / "_toc.yml").read_text()
    chapters = [
        c for c in re.findall(r"file:\s*(book/\S+)", toc) if (ROOT / f"{c}.ipynb").is_file()
    ]
    assert len(chapters) >= 10, chapters
    # the one home of the address (.ci/repository_url.py keeps the install cells in step)
    url = re.search(r"^repository:\s*\n\s+url:\s*(\S+)", (ROOT / "_config.yml").read_text(), re.M)
    repo = url.group(1).removeprefix("https://github.com/")
    for chapter in chapters:
        text = (SITE / f"{chapter}.html").read_text(encoding="utf-8")
        notebook = f"{chapter}.ipynb"
        colab = f"https://colab.research.google.com/github/{repo}/blob/main/{notebook}"
        binder = f"https://mybinder.org/v2/gh/{repo}/main?urlpath=tree/{notebook}"
        assert colab in text, chapter
        assert binder in text, chapter


def _sidebar_links(page):
    nav = re.search(
        r'<nav class="[^"]*bd-docs-nav.*?</nav>', page.read_text(encoding="utf-8"), re.S
    )
    assert nav, f"{page}: no sidebar"
    return re.findall(r'<a class="reference[^"]*" href="([^"]+)"', nav.group(0))


def test_sidebar_links_the_notation_page_and_the_index_of_statements():
    # _toc.yml names the index with a placeholder that book/_ext/proof_index_in_toc.py
    # resolves; a relative link on every page, so it works offline and in subfolders.
    index = SITE / "prf-prf.html"
    assert index.is_file(), "sphinx-proof did not write its index"
    for page in [
        SITE / "book" / "rope.html",
        SITE / "book" / "notation.html",
        SITE / "book" / "index.html",
    ]:
        links = _sidebar_links(page)
        # The current page links to itself as "#".
        targets = {(page.parent / href.split("#")[0]).resolve() for href in links if href[0] != "#"}
        targets.add(page.resolve())
        assert index.resolve() in targets, (page, links)
        assert (SITE / "book" / "notation.html").resolve() in targets, (page, links)


def test_index_of_statements_lists_them_by_chapter_as_numbered_in_the_text():
    # book/_ext/proof_index_in_toc.py: "Proposition 9.4" and its title, under its chapter,
    # not sphinx-proof's bare labels.
    text = (SITE / "prf-prf.html").read_text(encoding="utf-8")
    assert "<h1>Index of statements</h1>" in text
    link = re.search(
        r'<a href="book/rope.html#prop-rope-layouts"><code class="xref">([^<]*)</code>', text
    )
    assert link and re.fullmatch(r"Proposition 9\.\d+", link.group(1)), link
    assert re.search(r'<code class="xref">9\. Rotary position embedding</code>', text)
    rows = re.findall(r'<code class="xref">([^<]*)</code></a>\s*</td><td>\s*<em>([^<]*)</em>', text)
    statements = [(name, title) for name, title in rows if re.match(r"[A-Z][a-z]+ \d", name)]
    assert len(statements) >= 50, rows[:5]
    # A title, or the opening words of an untitled statement.
    assert all(title.strip() for _, title in statements), statements


def test_notation_page_defines_the_source_documents():
    text = (SITE / "book" / "notation.html").read_text(encoding="utf-8")
    assert "source documents" in text
    for author in ("Su", "Canal", "Wang", "Notes on Positional Encoding"):
        assert author in text, author
    for term in ("interleaved", "half", "kv_heads", "key minus query"):
        assert term in text, term


def test_punctuation_after_inline_math_stays_on_its_line():
    # book/_ext/math_punctuation.py groups a formula with the punctuation touching it.
    math = r'<span class="math notranslate nohighlight">\\\([^<]*\\\)</span>'
    loose = {}
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(math + r"[.,;:)]", text):
            opening = re.search(
                r'<span class="nowrap">[(\[{\u2018\u201c]*$',
                text[max(0, match.start() - 40) : match.start()],
            )
            if not opening:
                loose.setdefault(page.relative_to(SITE).as_posix(), []).append(match.group(0))
    grouped = sum(p.read_text(encoding="utf-8").count('<span class="nowrap">') for p in _pages())
    assert not loose, loose
    assert grouped > 100, grouped


# ------------------------------------------------------------------ API reference


def _public_names():
    import posenc
    import posenc.lab

    return [
        (f"{ns.__name__}.{name}", getattr(ns, name))
        for ns in (posenc, posenc.lab)
        for name in ns.__all__
    ]


def _entries():
    """id -> (page, the entry's HTML) of every documented object in the reference."""
    found = {}
    for page in sorted((SITE / "book" / "reference").glob("*.html")):
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r'<dt class="sig sig-object py" id="([^"]+)">', text):
            start = text.rfind("<dl", 0, match.start())
            depth, end = 0, start
            for tag in re.finditer(r"<dl[ >]|</dl>", text[start:]):
                depth += -1 if tag.group(0) == "</dl>" else 1
                if depth == 0:
                    end = start + tag.end()
                    break
            found[match.group(1)] = (page.name, text[match.start() : end])
    return found


def test_reference_has_an_entry_with_its_signature_for_every_public_name():
    import inspect

    entries = _entries()
    assert entries, f"no reference pages under {SITE / 'book' / 'reference'}"
    for name, obj in _public_names():
        assert name in entries, f"{name} has no entry in the built reference"
        page, html = entries[name]
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue  # constants: a name and its '#:' comment
        if inspect.isclass(obj) and issubclass(obj, Warning):
            continue  # a warning category posenc issues; a user never constructs it
        assert '<span class="sig-paren">(</span>' in html, f"{name} ({page}): no signature"
        try:
            params = [
                p.name
                for p in inspect.signature(obj).parameters.values()
                if p.name not in ("self", "cls")
            ]
        except (TypeError, ValueError):
            params = []
        shown = re.findall(
            r'<em class="sig-param">.*?<span class="pre">\*{0,2}([\w]+)</span>', html
        )
        missing = [p for p in params if p not in shown]
        if inspect.isclass(obj) and "__init__" not in vars(obj) and not hasattr(obj, "_fields"):
            missing = []  # nn.Module's own constructor: the class takes no parameters
        assert not missing, f"{name} ({page}): parameters not in its signature: {missing}"


def test_reference_documents_nothing_outside_the_public_api():
    public = {name for name, _ in _public_names()}
    classes = {n for n, (_, html) in _entries().items() if n in public}
    for name in _entries():
        owner = name.rpartition(".")[0]
        assert name in public or owner in classes, f"{name} is documented but not public"


def test_each_scheme_entry_links_to_the_chapter_that_derives_it():
    import posenc

    entries = _entries()
    for cls in posenc.SCHEMES.values():
        page, html = entries[f"posenc.{cls.__name__}"]
        chapters = re.findall(r'href="\.\./([a-z_]+)\.html#chapter-[a-z-]+"', html)
        assert chapters, f"{cls.__name__} ({page}): no link to its chapter"
        for chapter in chapters:
            assert (SITE / "book" / f"{chapter}.html").is_file(), chapter
