"""Emit each inline ``<script>`` once per page.

Sphinx 7.4 keeps two copies of an inline script (``app.add_js_file(None, body=...)``)
that an extension adds after the builder is created: one under the file name ``None``,
added at once, and one under ``''``, re-added from the registry before writing.  The
two compare unequal, so both reach the page.  For sphinx-thebe's
``const THEBE_JS_URL = ...`` the second copy is a SyntaxError on every page
("Identifier 'THEBE_JS_URL' has already been declared"); sphinx-togglebutton's ``var``
lines were silently doubled.  The first copies run, so the launch buttons never
depended on the second.

This handler runs last on ``html-page-context`` and drops the second copy of any
script whose file name (``None`` read as ``''``), priority and attributes match an
earlier one.  Scripts with a file are untouched (Sphinx already de-duplicates them).
"""

import os


def _key(script):
    filename = getattr(script, "filename", script)
    filename = "" if filename is None else os.fspath(filename)
    attributes = getattr(script, "attributes", {})
    return filename, getattr(script, "priority", 500), tuple(sorted(attributes.items()))


def unique_scripts(scripts):
    """Scripts in their order with later duplicates removed (``None`` file == ``''``)."""
    seen = set()
    kept = []
    for script in scripts:
        key = _key(script)
        if key in seen:
            continue
        seen.add(key)
        kept.append(script)
    return kept


def _dedupe(app, pagename, templatename, context, doctree):
    if "script_files" in context:
        # A new list: the builder restores its own list after each page.
        context["script_files"] = unique_scripts(context["script_files"])


def setup(app):
    app.connect("html-page-context", _dedupe, priority=1000)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
