"""Inputs and the comparison that both FlexAttention sweeps use (test_flex*_sweep.py)."""

from __future__ import annotations

import copy
import math

import torch

from posenc import attention

HEADS, KV_HEADS, BATCH = 4, 2, 2
F32_ATOL = 1e-5


def inputs(q_len, k_len, head_dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, HEADS, q_len, head_dim, generator=g)
    k = torch.randn(BATCH, KV_HEADS, k_len, head_dim, generator=g)
    v = torch.randn(BATCH, KV_HEADS, k_len, head_dim, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def agree(scheme, q, k, v, where, **kwargs):
    """``flex`` against ``eager``: float32 to 1e-5; bfloat16 within its rounding of the output.

    bfloat16: both paths are compared with the eager path in float64 on the same
    (bfloat16) inputs; the fused kernel keeps float32 scores and rounds once, so
    its error is a few units in the last place of bfloat16 (2**-8 relative).
    """
    with torch.no_grad():
        got = attention(q, k, v, encoding=scheme, backend="flex", **kwargs)
        if q.dtype == torch.float32:
            want = attention(q, k, v, encoding=scheme, backend="eager", **kwargs)
            err = (got - want).abs().max().item()
            assert err <= F32_ATOL, f"{where}: flex differs from eager by {err:.3g}"
            return
        wide = copy.deepcopy(scheme).double()  # the same parameters, in float64
        want = attention(q.double(), k.double(), v.double(), encoding=wide, backend="eager",
                         **kwargs)  # fmt: skip
        bound = 4 * 2.0**-8 * max(want.abs().max().item(), 1.0)
        err = (got.double() - want).abs().nan_to_num(math.inf).max().item()
        assert err <= bound, f"{where}: bfloat16 error {err:.3g} > {bound:.3g}"
