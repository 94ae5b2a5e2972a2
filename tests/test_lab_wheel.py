"""The wheel, installed where the checkout is not, works (issue 19 item 9, issue 28 item 5).

Builds a wheel from a copy of the tracked files (offline, without build isolation, as
``make dist`` does), installs it with ``--no-deps`` into a fresh virtual environment
that sees none of the checkout, and runs there, from an empty folder with ``python -I``:

- the lab's stored results (package data) through ``posenc.lab.load_results()``;
- the README's library snippets, as ``tests/test_readme.py`` runs them here;
- every code cell of one chapter (``book/why_positions.ipynb``), in order.

The fresh environment has no torch of its own: a ``.pth`` file puts the site-packages
of the environment running the tests (where torch, NumPy and Matplotlib live) after its
own, so posenc comes from the wheel and everything else from there.  That folder's own
``.pth`` files (the editable install of the checkout among them) are not processed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch

import posenc

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "book" / "why_positions.ipynb"

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None, reason="needs git to list the tracked files"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    tracked = subprocess.run(
        ["git", "ls-files", "pyproject.toml", "README.md", "posenc"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for name in tracked:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "wheel", "--no-deps",
         "--no-build-isolation", "--no-index", "-w", str(tmp / "dist"), str(src)],
        check=True, capture_output=True,
    )  # fmt: skip
    (built,) = (tmp / "dist").glob("posenc-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh(wheel, tmp_path_factory):
    """A new virtual environment with the wheel installed: ``run(code) -> stdout``."""
    tmp = tmp_path_factory.mktemp("fresh")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    torch_site = Path(torch.__file__).resolve().parents[1]
    assert torch_site != Path(sysconfig.get_paths()["purelib"]).parent
    (Path(purelib) / "_torch_from_the_test_environment.pth").write_text(f"{torch_site}\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "--python",
         str(python), "install", "--no-deps", "--no-index", str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    work = tmp / "work"  # an empty folder: nothing of the checkout beside the code
    work.mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp),
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": str(tmp / "mpl"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }

    def run(code: str, timeout: float = 600) -> str:
        script = work / "script.py"
        script.write_text(code)
        out = subprocess.run(
            [str(python), "-I", str(script)], cwd=work, env=env, capture_output=True,
            text=True, timeout=timeout, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-4000:]
        return out.stdout

    run.purelib = Path(purelib)
    return run


def test_the_wheel_is_the_package_at_this_version(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        version = re.search(r"^Version: (\S+)$", z.read(metadata).decode(), re.M).group(1)
    assert version == posenc.__version__
    for data in ("full", "recall", "smoke"):
        assert f"posenc/lab/results/{data}.json" in names, data
    assert not [n for n in names if n.startswith(("tests/", "book/", "benchmarks/"))]


def test_posenc_comes_from_the_wheel_and_torch_from_outside(fresh):
    out = fresh(
        "import importlib.metadata, posenc, torch\n"
        "print(posenc.__file__)\nprint(torch.__file__)\n"
        "print(posenc.__version__, importlib.metadata.version('posenc'))\n"
    )
    where, torch_file, versions = out.splitlines()
    assert Path(where).is_relative_to(fresh.purelib), where
    assert not Path(torch_file).is_relative_to(fresh.purelib)
    assert versions.split() == [posenc.__version__] * 2


def test_the_installed_wheel_loads_the_stored_results(fresh):
    out = fresh(
        "import posenc.lab as lab; r = lab.load_results(); s = lab.load_results('smoke');"
        "q = lab.load_results('recall');"
        "print(lab.__file__); print(len(r['seeds']), len(s['seeds']), len(q['seeds']))"
    )
    where, counts = out.splitlines()
    assert Path(where).is_relative_to(fresh.purelib), where
    full, smoke, recall = (int(c) for c in counts.split())
    assert full >= 5 and smoke >= 3 and recall >= 5


def test_the_readme_library_snippets_run_from_the_wheel(fresh):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 3
    code = "\n".join(blocks)
    out = fresh(code + "\nprint(tuple(out.shape))\nprint(float((decoded - full).abs().max()))")
    shape, err = out.splitlines()[-2:]
    assert shape == "(2, 8, 1024, 64)"
    assert float(err) < 1e-12


def chapter_script(notebook: Path) -> tuple[str, int]:
    """The chapter's code cells as one script; IPython syntax turned into calls.

    Cells tagged ``skip-execution`` are left out, as the book's own runs leave them.
    ``get_ipython()`` allows ``%matplotlib`` only: the install cell must find posenc
    already importable, so a ``%pip`` means the wheel was not found.
    """
    from IPython.core.inputtransformer2 import TransformerManager

    transform = TransformerManager().transform_cell
    cells = []
    for cell in json.loads(notebook.read_text())["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "code" and "skip-execution" not in tags:
            cells.append(transform("".join(cell["source"])))
    prologue = (
        "class _Shell:\n"
        "    def run_line_magic(self, name, line, *args, **kwargs):\n"
        "        if name != 'matplotlib':\n"
        "            raise RuntimeError(f'the chapter ran %{name} {line}')\n"
        "def get_ipython():\n"
        "    return _Shell()\n"
    )
    epilogue = f"\nprint('chapter ran {len(cells)} cells')\n"
    return prologue + "\n".join(cells) + epilogue, len(cells)


def test_a_chapter_runs_from_the_wheel(fresh):
    script, cells = chapter_script(CHAPTER)
    assert cells >= 10
    assert "run_line_magic('pip'" in script  # the install cell is there, and must not run
    out = fresh(script)
    assert out.splitlines()[-1] == f"chapter ran {cells} cells"
