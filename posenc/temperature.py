"""Llama 4's query temperature on its NoPE layers: :class:`TemperedNoPE`.

Llama 4 (iRoPE) leaves every fourth layer without RoPE and, on those layers
only, multiplies each query by a temperature that grows with the query's own
absolute position ``i`` (transformers 5.23, ``Llama4TextAttention.forward``,
``attn_temperature_tuning``)::

    tau(i) = 1 + attn_scale * log(floor((i + 1) / floor_scale) + 1)

with ``attn_scale = 0.1`` and ``floor_scale = 8192`` in the released configs
(``Llama4TextConfig``).  ``tau`` is 1 for the first ``floor_scale - 1``
positions and steps up by a log at every multiple of ``floor_scale``: logits
that would flatten as the number of keys grows are sharpened again, a floored
variant of scalable softmax (Nakanishi, 2025, arXiv:2501.19399, which
transformers cites there).  The positions are absolute: with a KV cache,
transformers counts from the cached length (``past_seen_tokens``), which is
what ``ctx.q_positions`` holds here.

Keys, values and the scores' scale are untouched, so the scheme is NoPE with a
per-query factor; it only transforms each query by its own position, so a
:class:`posenc.KVCache` and every backend of :func:`posenc.attention` serve it.
It is not registered in :data:`posenc.SCHEMES`: it is an option of NoPE that
one model family ships, not a scheme of its own; the lab's layer patterns
(:mod:`posenc.lab.patterns`) use it for Llama 4's NoPE layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ._checks import check_build_args, check_float, check_int
from .context import CallContext
from .scheme import PositionalScheme

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["TemperedNoPE", "llama4_temperature"]


def llama4_temperature(
    positions: torch.Tensor,
    *,
    attn_scale: float = 0.1,
    floor_scale: int = 8192,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Llama 4's query temperature ``1 + attn_scale * log1p(floor((i + 1) / floor_scale))``.

    Parameters
    ----------
    positions
        Integer absolute positions ``i`` of the queries, any shape.
    attn_scale
        Strength of the temperature (``>= 0``; Llama 4: 0.1).
    floor_scale
        Tokens per step of the floor (``>= 1``; Llama 4: 8192).
    dtype
        Floating dtype of the result (transformers computes it in float32).

    Returns
    -------
    A tensor of ``positions``' shape and ``dtype``.  The floor is taken by exact
    integer division, which equals transformers' float32 ``floor((i + 1.0) /
    floor_scale)`` for every position below ``2**24``.

    Examples
    --------
    >>> import torch, posenc
    >>> i = torch.tensor([0, 6, 7, 15, 23])
    >>> posenc.llama4_temperature(i, attn_scale=0.1, floor_scale=8, dtype=torch.float64)
    tensor([1.0000, 1.0000, 1.0693, 1.1099, 1.1386], dtype=torch.float64)
    """
    if not isinstance(positions, torch.Tensor) or positions.is_floating_point():
        raise TypeError("positions must be an integer tensor of absolute positions")
    attn_scale = check_float("attn_scale", attn_scale, minimum=0.0)
    floor_scale = check_int("floor_scale", floor_scale, minimum=1)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    steps = torch.div(positions.long() + 1, floor_scale, rounding_mode="floor")
    return torch.log1p(steps.to(dtype)) * attn_scale + 1.0


class TemperedNoPE(PositionalScheme):
    """NoPE with Llama 4's query temperature (its NoPE layers, ``attn_temperature_tuning``).

    :meth:`rotate` multiplies each query ``(batch, heads, q_len, d)`` by
    :func:`llama4_temperature` of its position (``ctx.q_positions``, ``(q_len,)``
    or ``(batch, q_len)``), computed in float32 (float64 for float64 inputs)
    and rounded back to the query's dtype, as transformers does; keys pass
    unchanged.  ``attn_scale=0`` is :class:`posenc.NoPE` exactly.

    Parameters
    ----------
    attn_scale
        Strength (``>= 0``), Llama 4's ``config.attn_scale`` (0.1).
    floor_scale
        Tokens per step (``>= 1``), Llama 4's ``config.floor_scale`` (8192).

    Examples
    --------
    >>> import torch, posenc
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 1, 2, 6, 4, generator=g, dtype=torch.float64)
    >>> tempered = posenc.TemperedNoPE(attn_scale=0.5, floor_scale=2)
    >>> tau = posenc.llama4_temperature(torch.arange(6), attn_scale=0.5, floor_scale=2,
    ...                                 dtype=torch.float64)
    >>> out = posenc.attention(q, k, v, encoding=tempered, causal=True)
    >>> torch.allclose(out, posenc.attention(q * tau[:, None], k, v, causal=True))
    True
    >>> tau.tolist()[:4]  # 1 until position floor_scale - 1
    [1.0, 1.3465735902799727, 1.3465735902799727, 1.549306144334055]
    """

    def __init__(self, *, attn_scale: float = 0.1, floor_scale: int = 8192) -> None:
        super().__init__()
        self.attn_scale = check_float("attn_scale", attn_scale, minimum=0.0)
        self.floor_scale = check_int("floor_scale", floor_scale, minimum=1)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q * tau(q_positions), k)``, the product in float32 (float64 for float64 ``q``)."""
        work = torch.promote_types(q.dtype, torch.float32)
        tau = llama4_temperature(
            ctx.q_positions, attn_scale=self.attn_scale, floor_scale=self.floor_scale, dtype=work
        )
        # (q_len,) -> (q_len, 1); (batch, q_len) -> (batch, 1, q_len, 1)
        tau = tau[:, None] if tau.dim() == 1 else tau[:, None, :, None]
        return (q.to(work) * tau).to(q.dtype), k

    @classmethod
    def build(
        cls,
        num_heads: int,
        head_dim: int,
        *,
        max_len: int | None = None,
        causal: bool = True,
        **options: Any,
    ) -> Self:
        """An instance; ``options`` are ``attn_scale`` and ``floor_scale`` (no per-head state)."""
        check_build_args(num_heads, head_dim, max_len, causal)
        return cls(**options)

    def extra_repr(self) -> str:
        return f"attn_scale={self.attn_scale}, floor_scale={self.floor_scale}"
