"""Upstream bug: FlexAttention's CPU kernel fails to build for a table of symbolic size.

The CPU template writes the score_mod's code, then replaces the names of two size
placeholders with "cur_qSplitSize" and "cur_kvSplitSize" by plain text substitution
(torch/_inductor/codegen/cpp_flex_attention_template.py, CppFlexAttentionTemplate.modification).
When a captured table's size is symbolic, its kernel argument (e.g. "ks18") can start with
a placeholder's name ("ks1") and becomes "cur_qSplitSize8": the C++ does not compile.
Automatic dynamic shapes make a table symbolic as soon as one compiled function sees two
tables of different sizes, which is what calling it with two schemes (or two head counts)
does.  posenc's workaround (posenc/flex.py): one compiled region per scheme class and
signature, compiled with dynamic=False and explicit dynamic marks on the sequence lengths
only, so no table is ever symbolic.  Remove it when this prints "absent".

Run: python .ci/upstream/flex_cpu_symbolic_table.py
"""

import os
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

print("torch", torch.__version__, "| CPU capability", torch.backends.cpu.get_cpu_capability())
compiled = torch.compile(flex_attention)  # one compiled function, as a user would write it
q, k, v = (torch.randn(1, 4, 300, 32) for _ in range(3))
causal = create_block_mask(lambda b, h, i, j: j <= i, 1, 1, 300, 300, device="cpu")
failures = []


def score_mod(score, b, h, i, j):
    return score + table[(i - j).clamp(0, table.shape[0] - 1)]


for size in (4, 32):  # the second table makes its size symbolic
    table = torch.randn(size)
    try:
        compiled(q, k, v, score_mod=score_mod, block_mask=causal)
    except Exception as exc:  # InductorError wrapping CppCompileError
        failures.append(f"table of {size}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
print("present" if failures else "absent", *failures, sep="\n  ")
