"""The wheel ships the lab's stored results (issue 19, item 9).

Builds a wheel from a copy of the package (offline, without build isolation),
installs it with ``--no-deps`` into an empty target directory, and calls
``posenc.lab.load_results()`` from outside the repository with only that
directory (and the environment's torch) importable.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to list the tracked files")
def test_the_installed_wheel_loads_the_stored_results(tmp_path):
    src = tmp_path / "src"
    tracked = subprocess.run(
        ["git", "ls-files", "pyproject.toml", "README.md", "posenc"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for name in tracked + ["posenc/lab/results/full.json", "posenc/lab/results/smoke.json"]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w",
         str(tmp_path / "dist"), str(src)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("posenc-*.whl")
    target = tmp_path / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    code = (
        "import posenc.lab as lab; r = lab.load_results(); s = lab.load_results('smoke');"
        "q = lab.load_results('recall');"
        "print(lab.__file__); print(len(r['seeds']), len(s['seeds']), len(q['seeds']))"
    )
    out = subprocess.run(
        [sys.executable, "-s", "-c", code], cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    where, counts = out.stdout.splitlines()
    assert where.startswith(str(target)), where
    full, smoke, recall = (int(c) for c in counts.split())
    assert full >= 5 and smoke >= 3 and recall >= 5
