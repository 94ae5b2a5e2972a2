"""Drop per-cell execution timestamps from notebooks: they change on every run and churn diffs.

Usage: python .ci/strip_timings.py book/<chapter>.ipynb [...]
"""

import sys

import nbformat

for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
