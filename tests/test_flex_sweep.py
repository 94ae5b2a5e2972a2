"""The fused kernel equals the eager path on every length, head dimension and dtype (issue 26).

PyTorch 2.13's CPU FlexAttention kernel returned wrong rows on AVX2 machines for
head dimensions 8 and 16 at lengths = 8 (mod 16) (``.ci/upstream/flex_cpu_tail_rows.py``);
posenc pads such heads (``posenc/flex.py``).  This sweep compares
``backend="flex"`` with ``backend="eager"`` (itself checked against float64
loops in each scheme's tests) for ALiBi, a scheme with a score_mod: head
dimensions 8-128, every length 1-160 and lengths around 256, 512 and 2048,
prefill and decoding, float32 and bfloat16, batch 2 with grouped-query heads.
``test_flex_schemes_sweep.py`` runs every fused scheme the same way with a
padding mask and per-sample positions.

``make test`` runs both files twice: in the main run, pinned to AVX2
(``ATEN_CPU_CAPABILITY=avx2``), and in the native run of the fused-path tests,
so a machine with AVX-512 checks both kernels.  Lengths are dynamic in the
compiled graph: a signature costs three compiles (one query and one key, one
query, many), and a length a guard check and a kernel run.
"""

from __future__ import annotations

import pytest
import torch
from flex_sweep_cases import HEADS, agree, inputs

import posenc
from posenc import flex

pytestmark = [
    pytest.mark.skipif(not flex.flex_available("cpu"), reason="FlexAttention cannot compile here"),
    pytest.mark.usefixtures("quiet_padding_notice"),
]

# every head dimension in float32; bfloat16 at a padded and an unpadded one
SIGNATURES = [(d, torch.float32) for d in (8, 16, 32, 64, 128)]
SIGNATURES += [(16, torch.bfloat16), (64, torch.bfloat16)]
LENGTHS = (*range(1, 161), 255, 256, 257, 511, 512, 513, 2047, 2048, 2049)


@pytest.mark.parametrize(
    "head_dim, dtype", SIGNATURES, ids=[f"d{d}-{str(t)[6:]}" for d, t in SIGNATURES]
)
def test_kernel_every_length_prefill_and_decoding(head_dim, dtype):
    scheme = posenc.ALiBi(HEADS)
    for n in LENGTHS:
        q, k, v = inputs(n, n, head_dim, dtype, seed=n)
        agree(scheme, q, k, v, f"prefill, head_dim {head_dim}, length {n}", causal=True)
        agree(scheme, q[:, :, -1:], k, v, f"decoding, head_dim {head_dim}, cache {n}",
               causal=True)  # fmt: skip
