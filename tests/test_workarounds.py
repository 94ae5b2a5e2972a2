"""Tests for posenc._workarounds: upstream bugs that must not reach posenc's numbers."""

import subprocess
import sys

# The first float64 cos of a fresh process, checked against math.cos.  Without
# the warm-up about one process in four returns errors of ~7e-9 (pytorch#188792).
FIRST_CALL = r"""
import math
import torch
import posenc
w = posenc.sinusoidal_inv_freq(128)
ang = (64 * torch.arange(1, 64, dtype=torch.float64))[:, None] * w
ref = torch.tensor([[math.cos(v) for v in row] for row in ang.tolist()], dtype=torch.float64)
print((ang.cos() - ref).abs().max().item())
"""


def test_first_float64_cos_of_a_fresh_process_is_accurate():
    # A race: each unprotected process fails with probability ~0.1-0.25, so
    # twelve of them catch a regression nearly always.
    errors = [
        float(
            subprocess.run(
                [sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(12)
    ]
    assert max(errors) <= 2.3e-16, errors
