"""Each upstream fault posenc routes around, shown present and routed around (issue 26).

The faults and their standalone checks are in ``.ci/upstream/`` and the README
("Upstream workarounds").  The vector ISA is fixed when torch is imported, so
each case runs in a fresh interpreter with ``ATEN_CPU_CAPABILITY`` set and an
Inductor cache directory of its own.  A fault that PyTorch has fixed skips its
test with a note that the workaround can go; it never fails the build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from posenc import flex

pytestmark = pytest.mark.skipif(
    not flex.flex_available("cpu"), reason="FlexAttention cannot compile here"
)

# ALiBi through backend="flex" against the eager path at lengths = 8 (mod 16), where
# the AVX2 kernel reads past a block's tail; PAD says whether posenc pads small heads.
# The wrong rows come from memory the kernel should not read, so they change from run
# to run and are sometimes right (once all three of a single draw at head_dim 16): with
# HEAD_DIMS, seven lengths and three draws each, a run that is right by chance is
# unlikely (in a probe, 28 of the 42 calls were wrong).
ERRORS = """
import json, sys, warnings
import torch, posenc
from posenc import flex
warnings.simplefilter("ignore")
if not {pad}:
    flex.CPU_MIN_HEAD_DIM = 0  # the workaround switched off
torch.manual_seed(0)
errors = []
for head_dim in {head_dims}:
    for n in (24, 40, 56, 72, 88, 104, 120):
        for _ in range(3):
            q, k, v = (torch.randn(1, 4, n, head_dim) for _ in range(3))
            with torch.no_grad():
                got = posenc.attention(q, k, v, encoding=posenc.ALiBi(4), causal=True,
                                       backend="flex")
                want = posenc.attention(q, k, v, encoding=posenc.ALiBi(4), causal=True,
                                        backend="eager")
            errors.append((got - want).abs().nan_to_num(float("inf")).max().item())
print(json.dumps({{"isa": torch.backends.cpu.get_cpu_capability(), "errors": errors}}))
"""
HEAD_DIMS = (8, 16)


def _run(code: str, tmp_path, isa: str | None, cache: str = "cache") -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / cache), OMP_NUM_THREADS="1")
    env.pop("ATEN_CPU_CAPABILITY", None)
    if isa is not None:
        env["ATEN_CPU_CAPABILITY"] = isa
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _avx2_machine() -> bool:
    return torch.cpu._is_avx2_supported()


@pytest.mark.skipif(not _avx2_machine(), reason="needs an x86-64 CPU with AVX2")
def test_padding_small_heads_is_what_keeps_the_avx2_kernel_right(tmp_path):
    unpadded = _run(ERRORS.format(pad=False, head_dims=HEAD_DIMS), tmp_path, "avx2", "off")
    assert unpadded["isa"] == "AVX2"
    if max(unpadded["errors"]) <= 1e-5:
        pytest.skip("PyTorch's AVX2 kernel is right at head_dim 8 and 16 now: the padding can go")
    padded = _run(ERRORS.format(pad=True, head_dims=HEAD_DIMS), tmp_path, "avx2", "on")
    assert max(padded["errors"]) <= 1e-5, padded


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() != "AVX512", reason="needs a CPU with AVX-512"
)
def test_a_graph_cached_under_avx2_is_not_reused_under_avx512(tmp_path):
    # one cache directory, two processes: the second must not load the first's C++ loops
    code = ERRORS.format(pad=True, head_dims=(32,))  # head_dim 32: no padding involved
    first = _run(code, tmp_path, "avx2")
    second = _run(code, tmp_path, None)
    assert (first["isa"], second["isa"]) == ("AVX2", "AVX512")
    assert max(first["errors"]) <= 1e-5 and max(second["errors"]) <= 1e-5, (first, second)


DEFAULT_ISA = """
import json, warnings
import torch, posenc
torch.manual_seed(0)
q, k, v = (torch.randn(1, 4, 1100, 32) for _ in range(3))
alibi = posenc.ALiBi(4)
try:
    posenc.attention(q, k, v, encoding=alibi, causal=True, backend="flex")
    refused = ""
except RuntimeError as exc:
    refused = str(exc)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.no_grad():
        auto = posenc.attention(q, k, v, encoding=alibi, causal=True)
eager = posenc.attention(q, k, v, encoding=alibi, causal=True, backend="eager")
print(json.dumps({"available": posenc.flex_available(), "refused": refused,
                  "warnings": [str(w.message) for w in caught],
                  "auto_vs_eager": (auto - eager).abs().max().item()}))
"""


def test_without_a_vector_isa_flex_is_unavailable_and_auto_runs_eager(tmp_path):
    out = _run(DEFAULT_ISA, tmp_path, "default")
    assert out["available"] is False
    assert "backend='flex' cannot run here" in out["refused"] and "AVX2" in out["refused"]
    assert out["warnings"] == []  # auto does not try, fail and warn: it knows
    assert out["auto_vs_eager"] == 0.0
