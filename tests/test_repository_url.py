"""The repository address has one home (_config.yml); .ci/repository_url.py keeps the copies.

The install cell of every chapter carries the address (Colab cannot read _config.yml).
These tests run the script on a copy of the book, so they cannot touch the real files.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "repository_url.py"


@pytest.fixture
def book_copy(tmp_path):
    (tmp_path / ".ci").mkdir()
    shutil.copy(SCRIPT, tmp_path / ".ci")
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(ROOT / name, tmp_path)
    shutil.copytree(ROOT / "book", tmp_path / "book", ignore=shutil.ignore_patterns("_*"))
    return tmp_path


def run(root, *args):
    return subprocess.run(
        [sys.executable, str(root / ".ci" / "repository_url.py"), *args],
        capture_output=True,
        text=True,
    )


def test_every_install_cell_installs_from_the_configured_address():
    result = run(ROOT, "--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_one_command_moves_every_copy(book_copy):
    url = "https://github.com/someone/posenc-fork"
    assert run(book_copy, "--set", url).returncode == 0
    assert f"url: {url}" in (book_copy / "_config.yml").read_text()
    chapters = sorted((book_copy / "book").glob("*.ipynb"))
    assert len(chapters) >= 10
    for path in chapters:
        assert f"git+{url}" in nbformat.read(path, as_version=4).cells[1].source, path.name


def test_a_copy_that_differs_is_reported(book_copy):
    path = book_copy / "book" / "rope.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = nb.cells[1].source.replace("git+https://", "git+https://example.org/x/")
    nbformat.write(nb, path)
    result = run(book_copy, "--check")
    assert result.returncode == 1 and "rope.ipynb" in result.stdout, result.stdout


def test_a_malformed_address_is_refused(book_copy):
    result = run(book_copy, "--set", "not a url")
    assert result.returncode != 0 and "URL must look like" in result.stderr
