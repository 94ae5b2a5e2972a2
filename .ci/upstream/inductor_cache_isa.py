"""Upstream bug: Inductor's FX graph cache reuses CPU code generated for another vector ISA.

The cache key of a compiled graph does not include the vector ISA
(torch._inductor.cpu_vec_isa.pick_vec_isa(), which ATEN_CPU_CAPABILITY selects), but the
generated C++ does: its loops step by the ISA's lane count.  A graph compiled under
ATEN_CPU_CAPABILITY=avx2 (8 float lanes) and loaded in a process using AVX-512 (16 lanes)
is rebuilt with AVX-512 flags and runs with mismatched strides: silently wrong scores.
posenc's workaround (posenc/flex.py, _compile_options) puts the ISA's width into the
compile options (cpp.simdlen), which are part of the cache key.  Remove it when this
prints "absent" on a machine with AVX-512.

Run: python .ci/upstream/inductor_cache_isa.py   (needs a CPU with AVX-512 to tell)
"""

import os
import subprocess
import sys
import tempfile

import torch

CHILD = """
import torch
from torch.nn.attention.flex_attention import flex_attention
torch.manual_seed(0)
q, k, v = (torch.randn(1, 4, 40, 32) for _ in range(3))
distance = (torch.arange(40)[:, None] - torch.arange(40)).abs()
want = torch.softmax(q.double() @ k.double().mT / 32**0.5 - distance, -1) @ v.double()
alibi = lambda score, b, h, i, j: score - (i - j).abs()
out = torch.compile(flex_attention, dynamic=False)(q, k, v, score_mod=alibi)
print(torch.backends.cpu.get_cpu_capability(), (out.double() - want).abs().max().item())
"""

print("torch", torch.__version__, "| CPU capability", torch.backends.cpu.get_cpu_capability())
if torch.backends.cpu.get_cpu_capability() != "AVX512":
    print("not testable here: it takes a CPU with AVX-512 (and AVX2 for the first process)")
    sys.exit(0)
env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp())
errors = []
for isa in ("avx2", "avx512"):  # the first fills the cache, the second reads it
    run = dict(env, ATEN_CPU_CAPABILITY=isa)
    out = subprocess.run([sys.executable, "-c", CHILD], env=run, capture_output=True, text=True)
    capability, err = out.stdout.split()
    errors.append(float(err))
    print(f"  compiled under {capability}: max error {float(err):.2g}")
print("present" if max(errors) > 1e-4 else "absent")
