"""The repository's address lives in one place, ``repository.url`` in ``_config.yml``.

The launch buttons are built from it by Jupyter Book; the install cell of every
chapter (the hidden second cell, which installs posenc on Colab) carries a copy,
because a notebook opened on Colab cannot read ``_config.yml``.  This script keeps
those copies equal to the setting:

    python .ci/repository_url.py --check            # exit 1 if any copy differs
    python .ci/repository_url.py --set URL          # new address in _config.yml and every chapter

``make repository-url URL=https://github.com/you/posenc`` runs the second form.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "_config.yml"
# the address inside `pip install "posenc[book] @ git+<address>"`
INSTALL = re.compile(r'(posenc\[book\] @ git\+)([^"\s]+)')
SETTING = re.compile(r"^(repository:\s*\n\s+url:\s*)(\S+)", re.M)


def configured_url() -> str:
    match = SETTING.search(CONFIG.read_text(encoding="utf-8"))
    if match is None:
        raise SystemExit(f"{CONFIG}: no repository.url setting")
    return match.group(2)


def chapters() -> list[Path]:
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    names = re.findall(r"file:\s*(book/\S+)", toc)
    return [ROOT / f"{n}.ipynb" for n in names if (ROOT / f"{n}.ipynb").is_file()]


def install_cell(nb) -> nbformat.NotebookNode:
    """The chapter's second cell, which must be the hidden install cell."""
    cell = nb.cells[1]
    if "remove-cell" not in cell.metadata.get("tags", []) or not INSTALL.search(cell.source):
        raise ValueError("the second cell is not the hidden install cell")
    return cell


def copies() -> dict[Path, str]:
    """The address each chapter's install cell installs from."""
    return {
        p: INSTALL.search(install_cell(nbformat.read(p, as_version=4)).source).group(2)
        for p in chapters()
    }


def set_url(url: str) -> None:
    if not re.fullmatch(r"https://[\w.-]+/[\w./-]+", url):
        raise SystemExit(f"URL must look like https://host/owner/name, got {url!r}")
    CONFIG.write_text(SETTING.sub(lambda m: m.group(1) + url, CONFIG.read_text("utf-8")), "utf-8")
    for path in chapters():
        nb = nbformat.read(path, as_version=4)
        cell = install_cell(nb)
        cell.source = INSTALL.sub(lambda m: m.group(1) + url, cell.source)
        nbformat.write(nb, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="report copies that differ")
    group.add_argument("--set", metavar="URL", help="write URL to _config.yml and every chapter")
    args = parser.parse_args(argv)
    if args.set:
        set_url(args.set)
    url = configured_url()
    wrong = {p.name: u for p, u in copies().items() if u != url}
    for name, u in wrong.items():
        print(f"{name}: installs from {u}, _config.yml says {url}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
