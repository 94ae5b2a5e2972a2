"""The README's examples run as written (readers copy them first)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2, "the README should show the API in python blocks"
    namespace: dict = {}
    exec(compile("\n".join(blocks), str(README), "exec"), namespace)  # noqa: S102
    # every scheme the README names produced an attention output of the input's shape
    assert namespace["out"].shape == namespace["q"].shape
    assert namespace["q_rot"].dtype == namespace["q"].dtype
