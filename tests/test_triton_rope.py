"""Tests for posenc._triton_rope: the Triton kernel, run on the CPU under TRITON_INTERPRET=1.

Triton reads TRITON_INTERPRET when a kernel is decorated, so the check runs in a
fresh interpreter with the variable set; it compares the kernel with an explicit
float64 rotation for both layouts, partial rotary_dim, float32 and bfloat16, and
shared, per-item and per-row positions.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import math
    import torch
    import posenc
    from posenc import _triton_rope
    from posenc._rope_kernels import table_batches
    from posenc._angles import compute_dtype

    torch.manual_seed(0)
    assert _triton_rope.available()

    def reference(x, positions, layout, r):
        # x (..., seq, dim) rotated pair by pair in float64, positions (..., seq)
        x = x.double()
        out = x.clone()
        pos = positions.double().expand(x.shape[:-1])
        for i in range(r // 2):
            t = pos * 10000.0 ** (-2.0 * i / r)
            a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + r // 2)
            out[..., a] = x[..., a] * t.cos() - x[..., b] * t.sin()
            out[..., b] = x[..., a] * t.sin() + x[..., b] * t.cos()
        return out

    checked = 0
    for dtype in (torch.float32, torch.bfloat16):
        for layout in ("interleaved", "half"):
            for r in (24, 16):
                for form in ("shared", "per item", "per row"):
                    x = torch.randn(2, 3, 37, 24).to(dtype)
                    if form == "per item":  # (batch, 1, seq): one table per batch item
                        positions = torch.randint(0, 40000, (2, 1, 37))
                    elif form == "per row":  # x.shape[:-1]: one table per (item, head)
                        positions = torch.randint(0, 40000, (2, 3, 37))
                    else:
                        positions = torch.arange(37) + 32700
                    cos, sin = posenc.rope_cos_sin(positions, r, dtype=compute_dtype(dtype))
                    out = torch.empty_like(x)
                    out[..., r:] = x[..., r:]
                    tables = table_batches(cos, sin, x.shape[:-2])
                    _triton_rope.rotate(x, *tables, layout, r, out)
                    exact = reference(x, positions, layout, r)
                    err = (out.double() - exact).abs().max().item()
                    if dtype == torch.bfloat16:
                        tol = 2 * (exact.to(dtype).double() - exact).abs().max().item()
                    else:
                        tol = 2e-6
                    assert err <= tol, (dtype, layout, r, form, err, tol)
                    assert torch.equal(out[..., r:], x[..., r:])
                    checked += 1
    print("checked", checked)
    """
)


def test_kernel_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checked 24" in done.stdout


def test_import_posenc_does_not_import_triton():
    code = "import sys, posenc; posenc.apply_rope; assert 'triton' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
