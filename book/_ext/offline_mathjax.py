"""Ship MathJax inside the built site, so math typesets offline.

Sphinx's default ``mathjax_path`` is a CDN URL: offline, or behind a firewall,
readers see raw LaTeX.  The PyPI package ``django-static-mathjax`` carries
MathJax 3 as plain files; this extension copies its ``es5`` bundle to
``_static/mathjax/`` and points ``mathjax_path`` there.
"""

import shutil
from pathlib import Path

import mathjax  # from django-static-mathjax

SOURCE = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
TARGET = Path("_static") / "mathjax"


def _use_local_mathjax(app, config):
    config.mathjax_path = (TARGET / "tex-chtml.js").relative_to("_static").as_posix()


def _copy_mathjax(app, exception):
    if exception is None and app.builder.format == "html":
        shutil.copytree(SOURCE, Path(app.outdir) / TARGET, dirs_exist_ok=True)


def setup(app):
    if not (SOURCE / "tex-chtml.js").is_file():
        raise RuntimeError(f"MathJax not found at {SOURCE}; install django-static-mathjax")
    app.connect("config-inited", _use_local_mathjax, priority=900)
    app.connect("build-finished", _copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
