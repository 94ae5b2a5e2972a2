"""Every fused scheme equals the eager path at every length, padded and decoding (issue 26).

``test_flex_sweep.py`` sweeps the kernel (head dimensions, dtypes, long
lengths) with ALiBi; here every registered scheme that fuses (those with a
score_mod and those that only rotate) runs at every length 1-160 with a
left-padded batch, per-sample positions and grouped-query heads, prefill and
decoding, at head dimension 16: the dimension posenc pads on a CPU, where the
upstream kernel was wrong.  The score_mod's code is the same for every head
dimension and input dtype (scores are float32), so its tails are what the
lengths test.  ``make test`` runs this file pinned to AVX2 and natively.
"""

from __future__ import annotations

import pytest
import torch
from flex_sweep_cases import BATCH, HEADS, agree, inputs

import posenc
from posenc import flex

pytestmark = [
    pytest.mark.skipif(not flex.flex_available("cpu"), reason="FlexAttention cannot compile here"),
    pytest.mark.usefixtures("quiet_padding_notice"),
]


def _fused_examples():
    """Every registered scheme that fuses (rotating ones too), with its variants."""
    out = {}
    for name, cls in posenc.SCHEMES.items():
        if cls.acts_on == "attention" and cls.fused():
            torch.manual_seed(0)
            for label, scheme in cls.examples(HEADS, 16).items():
                out[f"{name}-{label}" if label else name] = scheme
    return out


@pytest.mark.parametrize("name", list(_fused_examples()))
def test_every_fused_scheme_with_padding_positions_and_decoding(name):
    scheme, head_dim = _fused_examples()[name], 16
    for n in range(1, 161):
        q, k, v = inputs(n, n, head_dim, torch.float32, seed=n)
        keep = torch.ones(BATCH, n, dtype=torch.bool)
        keep[1, : n // 3] = False  # item 1 is left-padded
        pos = (keep.long().cumsum(-1) - 1).clamp(min=0)  # per-sample positions
        mask = keep[:, None, None, :]
        where = f"{name}, head_dim {head_dim}, length {n}"
        agree(scheme, q, k, v, where, causal=True, mask=mask, k_positions=pos)
        agree(scheme, q[:, :, -1:], k, v, "decoding " + where, causal=True, mask=mask,
               q_positions=pos[:, -1:], k_positions=pos)  # fmt: skip
