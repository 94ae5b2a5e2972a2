"""The compiled RoPE option (posenc._fused_rope) across many lengths (issue 21).

No timing: compiles are counted.  Before issue 21 each new length compiled
anew and, past Dynamo's recompile limit, the unfused Python ran; now the
lengths are dynamic, a failure warns once and runs the eager kernel, and the
interleaved layout takes the eager kernel (measured faster,
``benchmarks/bench_rope.py``).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import posenc
from posenc import _fused_rope

pytestmark = pytest.mark.skipif(
    not posenc.flex_available("cpu"), reason="torch.compile cannot build kernels here"
)


def _graphs():
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _float64_rope(x, layout):
    """RoPE at positions 0..seq-1 from the formula, in float64, independent of posenc."""
    seq, dim = x.shape[-2:]
    h = dim // 2
    omega = 10000.0 ** (-torch.arange(h, dtype=torch.float64) * 2 / dim)
    t = torch.arange(seq, dtype=torch.float64)[:, None] * omega
    c, s = torch.cos(t), torch.sin(t)
    x = x.double()
    if layout == "half":
        a, b = x[..., :h], x[..., h:]
        return torch.cat((a * c - b * s, a * s + b * c), -1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_twelve_lengths_compile_a_few_graphs_and_match_float64(dtype):
    g = torch.Generator().manual_seed(0)
    before = _graphs()
    bound = 2e-6 if dtype == torch.float32 else 2e-2
    with torch.no_grad():
        for seq in range(20, 20 + 12 * 7, 7):  # 12 lengths
            x = torch.randn(1, 3, seq, 16, generator=g).to(dtype)
            want = _float64_rope(x, "half")
            got = posenc.apply_rope(x, layout="half", compiled=True)
            assert got.dtype == dtype
            assert (got.double() - want).abs().max().item() < bound
            q, k = posenc.RotaryEmbedding(16, layout="half", compiled=True).rotate(
                x, x, torch.arange(seq), torch.arange(seq)
            )
            assert torch.equal(q, k) and (q.double() - want).abs().max().item() < bound
    # per function: a first static graph, then one with symbolic lengths
    assert _graphs() - before <= 4


def test_interleaved_compiled_runs_the_eager_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(_fused_rope, "_try", lambda *a: calls.append(a) or None)
    x = torch.randn(2, 4, 33, 16)
    with torch.no_grad():
        got = posenc.apply_rope(x, compiled=True)
    assert calls == []  # never handed to the compiler
    assert torch.equal(got, posenc.apply_rope(x))
    assert (got.double() - _float64_rope(x, "interleaved")).abs().max().item() < 2e-6


def test_a_compile_failure_warns_once_and_runs_eager(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("C++ compile error (simulated)")

    monkeypatch.setattr(_fused_rope._compile, "call", broken)
    monkeypatch.setattr(_fused_rope, "_failed", {})
    x = torch.randn(2, 4, 33, 16)
    with torch.no_grad():
        with pytest.warns(RuntimeWarning, match="simulated"):
            got = posenc.apply_rope(x, layout="half", compiled=True)
        assert torch.equal(got, posenc.apply_rope(x, layout="half"))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            posenc.apply_rope(x[..., :20, :], layout="half", compiled=True)  # same signature
