"""Workarounds for upstream bugs that would otherwise reach posenc's numbers.

Each entry names the bug, says what goes wrong, and runs once at import.
Remove an entry when the pinned PyTorch no longer has the bug.
"""

from __future__ import annotations

import torch

__all__: list[str] = []  # private module

# pytorch/pytorch#188792: on CPU, ATen hands contiguous unary math to MKL's VML,
# which picks each function's kernel lazily on its first call.  That first
# call races: now and then it runs a low-accuracy kernel, so the first float64
# cos of a fresh process can be off by ~7e-9 instead of 1e-16 (seen here with
# torch 2.13.0).  One tiny call per function and dtype settles the choice before
# any call that matters; it is the fix proposed upstream (pytorch#188791).
VML_FUNCTIONS = ("sin", "cos", "exp", "log", "sqrt", "tanh")


def warm_up_vml() -> None:
    """Make the first call of each VML function posenc uses, on a throwaway input."""
    for dtype in (torch.float32, torch.float64):
        x = torch.ones(1, dtype=dtype)
        for name in VML_FUNCTIONS:
            getattr(torch, name)(x)


warm_up_vml()
