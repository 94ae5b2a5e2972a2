"""The Taylor-expansion view of position encodings (Su, 2021).

A model ``f`` that has no positional information is *fully symmetric*: swapping
two input tokens ``x_m`` and ``x_n`` leaves its output unchanged.  Adding
position vectors ``p_m``, ``p_n`` breaks that symmetry.  Treating them as small
perturbations and expanding ``f`` to second order gives six terms,

    f + p_m^T g_m + p_n^T g_n + 1/2 p_m^T H_mm p_m + 1/2 p_n^T H_nn p_n + p_m^T H_mn p_n,

of which only the last involves both positions.  This module builds a small
symmetric attention model from :func:`posenc.attention` and computes every
term of that expansion with ``torch.func`` (exact autograd derivatives, no
finite differences), so a chapter can check the expansion term by term.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

import torch
from torch.func import grad, jacrev

from .._checks import check_float, check_float_dtype, check_floating, check_int
from .._types import Device
from ..attend import attention

__all__ = [
    "AttentionReadout",
    "SecondOrderExpansion",
    "second_order_expansion",
    "mixed_difference",
    "taylor_remainders",
]


class AttentionReadout(torch.nn.Module):
    """A scalar readout of one attention layer, with fixed random weights.

    ``f(x) = sum_i w . attention(x Wq, x Wk, x Wv)_i``: one head of
    :func:`posenc.attention` with no mask and no positional scheme, followed by
    a linear readout summed over positions.  Attention without positions is
    permutation-equivariant and the sum is permutation-invariant, so ``f`` is
    fully symmetric in its tokens: ``f(.., x_m, .., x_n, ..) = f(.., x_n, .., x_m, ..)``.

    Parameters
    ----------
    dim
        Token dimension ``d``.
    seed
        Seed of the CPU generator that draws the weights, so that the model is
        the same on every device.
    dtype
        Floating dtype of the weights; float64 (the default) for derivative checks.
    device
        Where the weights live.

    Notes
    -----
    Input ``x`` has shape ``(..., n, d)``; the output has shape ``(...)``.
    The weights are buffers, not parameters: the model is a fixed function.
    """

    # the buffers registered in __init__
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    readout: torch.Tensor

    def __init__(
        self, dim: int, *, seed: int = 0, dtype: torch.dtype = torch.float64, device: Device = None
    ) -> None:
        super().__init__()
        dim = check_int("dim", dim, minimum=1)
        seed = check_int("seed", seed)
        dtype = check_float_dtype("dtype", dtype)
        gen = torch.Generator().manual_seed(seed)
        # Scale 1/sqrt(d) keeps the scores O(1), so the softmax is far from saturation
        # and the second derivatives are not negligible.
        w = torch.randn(4, dim, dim, generator=gen, dtype=torch.float64) / dim**0.5
        self.register_buffer("wq", w[0].to(device=device, dtype=dtype))
        self.register_buffer("wk", w[1].to(device=device, dtype=dtype))
        self.register_buffer("wv", w[2].to(device=device, dtype=dtype))
        self.register_buffer("readout", w[3, 0].to(device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = check_floating("x", x, min_dim=2)
        if x.shape[-1] != self.wq.shape[0]:
            raise ValueError(f"x must have last dimension {self.wq.shape[0]}, got {x.shape[-1]}")
        out = attention(x @ self.wq, x @ self.wk, x @ self.wv)
        return (out @ self.readout).sum(-1)


@dataclass(frozen=True)
class SecondOrderExpansion:
    """Derivatives of ``f`` with respect to the tokens at positions ``m`` and ``n``.

    Attributes
    ----------
    value
        ``f(x)``, a scalar tensor.
    grad_m, grad_n
        ``df/dx_m`` and ``df/dx_n``, each ``(d,)``.
    hess_mm, hess_nn, hess_mn
        ``d2f/dx_m2``, ``d2f/dx_n2`` and the mixed ``d2f/dx_m dx_n``, each
        ``(d, d)``; ``hess_mn[i, j] = d2f / dx_m[i] dx_n[j]``.
    """

    value: torch.Tensor
    grad_m: torch.Tensor
    grad_n: torch.Tensor
    hess_mm: torch.Tensor
    hess_nn: torch.Tensor
    hess_mn: torch.Tensor

    def terms(self, p_m: torch.Tensor, p_n: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The six terms of the expansion at perturbations ``p_m``, ``p_n`` (each ``(d,)``).

        Returns ``(f, p_m.g_m, p_n.g_n, p_m H_mm p_m / 2, p_n H_nn p_n / 2, p_m H_mn p_n)``,
        each a scalar tensor; the last is the interaction term ``p_m^T H p_n``.
        """
        return (
            self.value,
            p_m @ self.grad_m,
            p_n @ self.grad_n,
            0.5 * p_m @ self.hess_mm @ p_m,
            0.5 * p_n @ self.hess_nn @ p_n,
            p_m @ self.hess_mn @ p_n,
        )

    def __call__(self, p_m: torch.Tensor, p_n: torch.Tensor) -> torch.Tensor:
        """The second-order approximation of ``f`` at ``x_m + p_m``, ``x_n + p_n``."""
        # six tensors, so never sum's start value 0
        return cast(torch.Tensor, sum(self.terms(p_m, p_n)))


def second_order_expansion(
    f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, m: int, n: int
) -> SecondOrderExpansion:
    """Expand ``f`` to second order in the tokens at positions ``m`` and ``n``.

    Parameters
    ----------
    f
        A function of a ``(num_tokens, d)`` tensor returning a scalar tensor,
        written with ``torch`` operations that ``torch.func`` can transform
        (e.g. an :class:`AttentionReadout`).
    x
        The tokens ``(num_tokens, d)``, floating point (float64 recommended).
    m, n
        Two distinct token indices in ``0 .. num_tokens-1``.

    Returns
    -------
    SecondOrderExpansion
        ``f(x)``, the gradients and the three Hessian blocks, all in ``x``'s
        dtype and on ``x``'s device, computed exactly by reverse-mode autograd
        (gradients and Hessians).
    """
    x = check_floating("x", x, min_dim=2)
    if x.dim() != 2:
        raise ValueError(f"x must have shape (num_tokens, d), got {tuple(x.shape)}")
    num_tokens = x.shape[0]
    m = check_int("m", m, minimum=0)
    n = check_int("n", n, minimum=0)
    if m >= num_tokens or n >= num_tokens:
        raise ValueError(f"m and n must be < num_tokens = {num_tokens}, got m={m}, n={n}")
    if m == n:
        raise ValueError(f"m and n must be distinct positions, got m = n = {m}")

    # f as a function of the two tokens only; the others stay fixed
    def f_mn(x_m: torch.Tensor, x_n: torch.Tensor) -> torch.Tensor:
        return f(x.index_copy(0, torch.tensor([m, n], device=x.device), torch.stack([x_m, x_n])))

    x_m, x_n = x[m], x[n]
    grad_m, grad_n = grad(f_mn, argnums=(0, 1))(x_m, x_n)
    # Reverse over reverse: same numbers as torch.func.hessian (forward over reverse), but it
    # avoids forward-mode AD, whose first use triggers a deprecation warning inside torch.
    both = (0, 1)
    (h_mm, h_mn), (_, h_nn) = jacrev(jacrev(f_mn, argnums=both), argnums=both)(x_m, x_n)
    return SecondOrderExpansion(f_mn(x_m, x_n), grad_m, grad_n, h_mm, h_nn, h_mn)


def mixed_difference(
    g: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], p_m: torch.Tensor, p_n: torch.Tensor
) -> torch.Tensor:
    """The mixed second difference ``g(p_m, p_n) - g(p_m, 0) - g(0, p_n) + g(0, 0)``.

    It vanishes exactly for any ``g`` that is a sum of a function of ``p_m``
    alone and a function of ``p_n`` alone, and equals ``g`` itself for a
    bilinear ``g`` such as ``p_m^T H p_n``.  It therefore detects which terms
    of an expansion couple the two positions.  ``g`` maps two tensors to a tensor.
    """
    p_m = check_floating("p_m", p_m)
    p_n = check_floating("p_n", p_n)
    zm, zn = torch.zeros_like(p_m), torch.zeros_like(p_n)
    return g(p_m, p_n) - g(p_m, zn) - g(zm, p_n) + g(zm, zn)


def taylor_remainders(
    f: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    m: int,
    n: int,
    p_m: torch.Tensor,
    p_n: torch.Tensor,
    eps: Iterable[float],
) -> torch.Tensor:
    """Absolute errors of the second-order expansion when ``(p_m, p_n)`` is scaled by ``eps``.

    Returns ``|f(x with x_m + e p_m, x_n + e p_n) - expansion(e p_m, e p_n)|`` for
    each ``e`` in ``eps`` (a sequence of floats), as a ``(len(eps),)`` tensor in
    ``x``'s dtype.  For a smooth ``f`` it shrinks like ``e**3``, so halving ``e``
    divides it by about 8.
    """
    expansion = second_order_expansion(f, x, m, n)
    p_m = check_floating("p_m", p_m, min_dim=1)
    p_n = check_floating("p_n", p_n, min_dim=1)
    if p_m.shape != (x.shape[-1],) or p_n.shape != (x.shape[-1],):
        raise ValueError(
            f"p_m and p_n must have shape ({x.shape[-1]},), got {tuple(p_m.shape)} and "
            f"{tuple(p_n.shape)}"
        )
    out = []
    for e in eps:
        e = check_float("eps", e, positive=True)
        shifted = x.clone()
        shifted[m] += e * p_m
        shifted[n] += e * p_n
        out.append((f(shifted) - expansion(e * p_m, e * p_n)).abs())
    return torch.stack(out)
