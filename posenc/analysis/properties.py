"""Measuring what a positional encoding should provide (chapter "What a positional encoding needs").

Each function turns one desired property into a number, so a chapter can tabulate
the schemes side by side instead of asserting the properties in prose:

* :func:`index_encoding`, :func:`fraction_encoding`: the two naive encodings;
* :func:`min_pair_distance`, :func:`count_distinct`: is every position's code distinct?
* :func:`shift_map`: is there one linear map carrying position ``p`` to ``p + k``?
* does a score or Gram matrix depend only on ``j - i``? That is
  :func:`posenc.analysis.toeplitz_distance`, from the complex-number derivation;
* :func:`offset_head_attention`, :func:`train_offset_head`: a one-head task where
  position is all that matters (attend ``shift`` tokens back, as a copy head must),
  to see what a learned table learns and what it cannot.

All computations are float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypedDict

import torch

from .._checks import check_floating, check_int, check_tensor
from .._types import Device

__all__ = [
    "index_encoding",
    "binary_encoding",
    "fraction_encoding",
    "min_pair_distance",
    "count_distinct",
    "shift_map",
    "offset_head_attention",
    "train_offset_head",
    "OffsetHead",
]


def index_encoding(seq_len: int, *, device: Device = None) -> torch.Tensor:
    """The raw index as a feature: ``(seq_len, 1)`` holding ``0, 1, ..., seq_len - 1``."""
    seq_len = check_int("seq_len", seq_len, minimum=1)
    return torch.arange(seq_len, device=device, dtype=torch.float64)[:, None]


def fraction_encoding(seq_len: int, *, device: Device = None) -> torch.Tensor:
    """The index divided by the last index: ``(seq_len, 1)`` spread evenly over ``[0, 1]``.

    The step between neighbours is ``1 / (seq_len - 1)``, so it depends on the
    length of the sequence; ``seq_len = 1`` gives ``[[0.0]]``.
    """
    seq_len = check_int("seq_len", seq_len, minimum=1)
    return index_encoding(seq_len, device=device) / max(seq_len - 1, 1)


def binary_encoding(seq_len: int, bits: int, *, device: Device = None) -> torch.Tensor:
    """Binary digits of the positions: ``(seq_len, bits)`` float64, column ``k`` is bit ``k``.

    Bit ``k`` (least significant first) flips every ``2**k`` positions and has
    period ``2**(k + 1)``; positions ``>= 2**bits`` wrap around.
    """
    seq_len = check_int("seq_len", seq_len, minimum=1)
    bits = check_int("bits", bits, minimum=1)
    p = torch.arange(seq_len, device=device)[:, None]
    k = torch.arange(bits, device=device)
    return ((p >> k) & 1).to(torch.float64)


def min_pair_distance(table: torch.Tensor) -> float:
    """Smallest Euclidean distance between two different rows of ``table: (n, d)``.

    Zero means two positions share a code; ``inf`` for a single row.
    """
    table = check_floating("table", table, min_dim=2).double()
    n = table.shape[0]
    if n < 2:
        return float("inf")
    dist = torch.cdist(table, table)
    dist.fill_diagonal_(float("inf"))
    return dist.min().item()


def count_distinct(codes: torch.Tensor, *, decimals: int = 9) -> int:
    """Number of distinct codes among the rows of ``codes: (n, ...)`` after rounding.

    Rows are rounded to ``decimals`` decimal places first, so codes that agree
    to within roundoff count as one.
    """
    codes = check_tensor("codes", codes, min_dim=1).double()
    decimals = check_int("decimals", decimals, minimum=0)
    rounded = torch.round(codes.reshape(codes.shape[0], -1), decimals=decimals)
    return int(torch.unique(rounded, dim=0).shape[0])


def shift_map(table: torch.Tensor, shift: int) -> tuple[torch.Tensor, float]:
    """The best single linear map ``M`` with ``table[p + shift] ~ M @ table[p]`` for all ``p``.

    Parameters
    ----------
    table
        ``(n, d)``, one code per row, ``n - shift`` should exceed ``d`` so the fit
        is determined.
    shift
        The offset ``k >= 1``.

    Returns
    -------
    ``(M, residual)``: ``M`` is ``(d, d)`` float64, fitted by least squares over
    every row pair ``(p, p + shift)``; ``residual`` is the largest absolute
    error of the fit over those rows, divided by the largest change
    ``|table[p + shift] - table[p]|`` the map has to explain (0 when one linear
    map relates every pair exactly; of order 1 when the best map misses by as
    much as the codes move).
    """
    table = check_floating("table", table, min_dim=2).double()
    shift = check_int("shift", shift, minimum=1)
    if shift >= table.shape[0]:
        raise ValueError(f"shift must be < the number of rows {table.shape[0]}, got {shift}")
    src, dst = table[:-shift], table[shift:]
    # rows are codes, so dst = src @ M.T; solve for M.T
    m_t = torch.linalg.lstsq(src, dst, driver="gelsd").solution
    residual = (src @ m_t - dst).abs().max() / (dst - src).abs().max().clamp_min(1e-300)
    return m_t.T.contiguous(), residual.item()


def offset_head_attention(
    codes: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor
) -> torch.Tensor:
    """Causal attention weights ``(n, n)`` of one head that sees position codes only.

    Scores are ``(codes @ w_q) @ (codes @ w_k).T / sqrt(k)`` for ``codes: (n, d)``
    and ``w_q, w_k: (d, k)``; query ``i`` may attend keys ``j <= i``.
    """
    q, k = codes @ w_q, codes @ w_k
    scores = q @ k.T / math.sqrt(k.shape[-1])
    n = codes.shape[0]
    future = torch.ones(n, n, dtype=torch.bool, device=codes.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)


class OffsetHead(TypedDict):
    """What :func:`train_offset_head` returns (a plain ``dict`` at run time)."""

    #: The trained query projection ``(dim, head_dim)``, float64, detached.
    w_q: torch.Tensor
    #: The trained key projection ``(dim, head_dim)``, float64, detached.
    w_k: torch.Tensor
    #: The loss at each step (before its update), ``steps`` floats.
    losses: list[float]


def train_offset_head(
    encoding: Callable[[int], torch.Tensor],
    parameters: Iterable[torch.Tensor],
    *,
    dim: int,
    seq_len: int,
    shift: int,
    steps: int = 200,
    lr: float = 0.05,
    head_dim: int = 8,
    seed: int = 0,
) -> OffsetHead:
    """Train one position-only head to attend from every query ``p`` to key ``p - shift``.

    This is the position half of a copy task (predict the token ``shift`` steps
    back): the loss is ``-log A[p, p - shift]`` averaged over ``p >= shift``.

    Parameters
    ----------
    encoding
        ``encoding(seq_len) -> (seq_len, dim)`` float64 codes, e.g. a
        :class:`posenc.LearnedEmbedding` or a fixed sinusoidal table.
    parameters
        The encoding's trainable parameters (empty for a fixed table); trained
        together with the head's ``w_q, w_k: (dim, head_dim)``.
    dim, seq_len, shift, steps, lr, head_dim
        Sizes and Adam settings; everything runs in float64.
    seed
        Seeds the initialisation of ``w_q`` and ``w_k`` (a private generator).

    Returns
    -------
    ``{"w_q", "w_k", "losses"}``: the trained projections and the loss per step.
    """
    check_int("seq_len", seq_len, minimum=2)
    shift = check_int("shift", shift, minimum=1)
    if shift >= seq_len:
        raise ValueError(f"shift must be < seq_len={seq_len}, got {shift}")
    gen = torch.Generator().manual_seed(seed)
    scale = 1 / math.sqrt(dim)
    w_q = (torch.randn(dim, head_dim, generator=gen, dtype=torch.float64) * scale).requires_grad_()
    w_k = (torch.randn(dim, head_dim, generator=gen, dtype=torch.float64) * scale).requires_grad_()
    opt = torch.optim.Adam([w_q, w_k, *parameters], lr=lr)
    p = torch.arange(shift, seq_len)
    losses: list[float] = []
    for _ in range(check_int("steps", steps, minimum=0)):
        attn = offset_head_attention(encoding(seq_len), w_q, w_k)
        loss = -attn[p, p - shift].log().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"w_q": w_q.detach(), "w_k": w_k.detach(), "losses": losses}
