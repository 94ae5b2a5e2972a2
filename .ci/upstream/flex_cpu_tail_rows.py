"""Upstream bug: FlexAttention's CPU kernel returns wrong rows for head_dim 8 or 16 on AVX2.

Inductor's transposed micro-GEMM (q @ k^T, torch/_inductor/codegen/cpp_micro_gemm.py,
CppMicroGemmFP32Vec, "first implementation") handles a tail of N keys that is a multiple of
the vector width, but less than its 16-key block, as a whole block: it reads keys past the
tail and writes scores past the row.  That path runs when head_dim % VLEN == 0 and
head_dim < 24, so with 8-lane AVX2 vectors, head_dim 8 or 16 and a key count = 8 (mod 16).
posenc's workaround (posenc/flex.py, _pad_head_dim) pads q and k to head_dim 32 below 24.
Remove it when this prints "absent" under ATEN_CPU_CAPABILITY=avx2.

Run: python .ci/upstream/flex_cpu_tail_rows.py   (and with ATEN_CPU_CAPABILITY=avx2)
"""

import os
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()  # no kernel from another ISA
import torch
from torch.nn.attention.flex_attention import flex_attention

print("torch", torch.__version__, "| CPU capability", torch.backends.cpu.get_cpu_capability())
compiled = torch.compile(flex_attention, dynamic=False)
torch.manual_seed(0)
wrong = []
for head_dim in (8, 16):
    for n in (24, 40, 56):  # = 8 (mod 16); one graph per head_dim, the length dynamic
        q, k, v = (torch.randn(1, 4, n, head_dim) for _ in range(3))
        for t in (q, k, v):
            torch._dynamo.mark_dynamic(t, 2)
        want = torch.softmax(q.double() @ k.double().mT / head_dim**0.5, -1) @ v.double()
        err = (compiled(q, k, v).double() - want).abs().nan_to_num(float("inf")).max().item()
        if err > 1e-4:
            wrong.append(f"head_dim {head_dim}, length {n}: max error {err:.2g}")
print("present" if wrong else "absent", *wrong, sep="\n  ")
