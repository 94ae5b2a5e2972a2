"""A positional scheme written outside posenc, in one file: ALiBi with learnable slopes.

Nothing in posenc knows this file.  It subclasses the contract,
:class:`posenc.PositionalScheme`, and writes one hook, ``score_mod``; posenc
derives the rest: the eager path evaluates the same function as a dense bias,
FlexAttention fuses it (``backend="flex"``), :class:`posenc.KVCache` decodes
with it, and it compiles.  ``tests/test_external_scheme.py`` checks each of
these; the README shows the class.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import posenc


class LearnedSlopeALiBi(posenc.PositionalScheme):
    """ALiBi whose per-head slopes are learned: ``score - softplus(rho_h) * |q_pos - k_pos|``.

    ``rho`` ``(num_heads,)`` starts at ALiBi's slopes (through the inverse of
    softplus), so the slopes stay positive while they train.
    """

    quadratic_memory = True  # the eager path builds the dense bias

    def __init__(self, num_heads: int):
        super().__init__()
        slopes = posenc.alibi_slopes(num_heads).float()
        self.rho = torch.nn.Parameter(slopes + torch.log(-torch.expm1(-slopes)))

    def score_mod(self, ctx):
        work = torch.promote_types(ctx.dtype, torch.float32)
        slopes = F.softplus(self.rho.to(device=ctx.device, dtype=work))

        def mod(score, b, h, q_pos, k_pos):
            return score - slopes[h] * (q_pos - k_pos).abs().to(work)

        return mod
