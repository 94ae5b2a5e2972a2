"""The interaction term p_m^T H p_n for a general H (Su, 2021, "General case").

With H = I the sinusoidal interaction depends on m - n only.  For a diagonal H,
product-to-sum splits it into a relative part in cos((m - n) theta_i) and an
absolute part in cos((m + n) theta_i); an off-diagonal H mixes the two features
of different frequencies and the clean split is lost.  This module computes the
split, a diagonal-dominance score, and a tiny trained attention model on which
the article's two assumptions (p small next to x, H diagonally dominant) can be
measured instead of assumed.

Layout: the sinusoidal table of :func:`posenc.sinusoidal_table` with
``layout="interleaved"``: feature ``2i`` holds ``sin(p theta_i)`` and ``2i + 1``
holds ``cos(p theta_i)`` (Vaswani et al., 2017).  Su (2021) puts cos first, which
flips the sign of the absolute part (see :func:`diagonal_form_terms`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._checks import check_even, check_float, check_floating, check_int
from .._types import Device
from ..attend import attention
from ..sinusoidal import sinusoidal_inv_freq, sinusoidal_table

__all__ = [
    "diagonal_form_terms",
    "DiagonalDominance",
    "diagonal_dominance",
    "order_task_batch",
    "OrderModel",
    "train_order_model",
]


def diagonal_form_terms(
    h: torch.Tensor, m: torch.Tensor, n: torch.Tensor, *, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Split :math:`p_m^\top \mathrm{diag}(h)\, p_n` into relative and absolute parts.

    With :math:`s_i = h_{2i}` (the sin feature) and :math:`c_i = h_{2i+1}` (the cos feature),
    product-to-sum gives

    .. math::
        p_m^\top \mathrm{diag}(h) p_n
        = \underbrace{\sum_i \tfrac12 (s_i + c_i) \cos((m-n)\theta_i)}_{\text{relative}}
        + \underbrace{\sum_i \tfrac12 (c_i - s_i) \cos((m+n)\theta_i)}_{\text{absolute}} .

    Su (2021) orders the pair (cos, sin) and so writes the absolute coefficient as
    ``H_{2i,2i} - H_{2i+1,2i+1}``; in this (sin, cos) layout it is ``h_{2i+1} - h_{2i}``.

    Parameters
    ----------
    h : torch.Tensor
        ``(d,)`` diagonal of H, floating point, ``d`` even.
    m, n : torch.Tensor
        Integer or float positions; they broadcast against each other.
    base : float
        Frequency base, ``theta_i = base**(-2i/d)``.

    Returns
    -------
    (relative, absolute) : tuple of torch.Tensor
        Each of the broadcast shape of ``m`` and ``n``, float64, on ``h``'s device.
    """
    h = check_floating("h", h, min_dim=1)
    if h.dim() != 1:
        raise ValueError(f"h must be the (d,) diagonal of H, got shape {tuple(h.shape)}")
    dim = check_even("len(h)", h.shape[0])
    base = check_float("base", base, positive=True)
    h = h.to(torch.float64)
    theta = sinusoidal_inv_freq(dim, base=base, device=h.device)
    m = torch.as_tensor(m, device=h.device).to(torch.float64)[..., None]
    n = torch.as_tensor(n, device=h.device).to(torch.float64)[..., None]
    s, c = h[0::2], h[1::2]
    relative = (0.5 * (s + c) * torch.cos((m - n) * theta)).sum(-1)
    absolute = (0.5 * (c - s) * torch.cos((m + n) * theta)).sum(-1)
    return relative, absolute


class DiagonalDominance(NamedTuple):
    """Two views of how diagonal a square matrix is.

    Attributes
    ----------
    magnitude_ratio : float
        mean |H_ii| divided by mean |H_ij| over i != j (the comparison Su (2021)
        makes for BERT's covariance matrices); large means diagonal-heavy.
    dominant_rows : float
        Fraction of rows with |H_ii| > sum_{j != i} |H_ij| (strict diagonal dominance).
    """

    magnitude_ratio: float
    dominant_rows: float


def diagonal_dominance(matrix: torch.Tensor) -> DiagonalDominance:
    """Diagonal dominance scores of a square ``(d, d)`` matrix (``d >= 2``).

    See :class:`DiagonalDominance`; computed on ``|matrix|`` in float64.
    """
    matrix = check_floating("matrix", matrix, min_dim=2)
    if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] < 2:
        raise ValueError(f"matrix must be square (d, d) with d >= 2, got {tuple(matrix.shape)}")
    a = matrix.detach().abs().to(torch.float64)
    diag = a.diagonal()
    off_rows = a.sum(1) - diag
    d = a.shape[0]
    ratio = diag.mean() / (off_rows.sum() / (d * (d - 1)))
    return DiagonalDominance(ratio.item(), (diag > off_rows).double().mean().item())


def order_task_batch(
    batch: int,
    seq_len: int,
    vocab: int,
    *,
    generator: torch.Generator | None = None,
    device: Device = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic task that needs order: does token 1 come before token 2?

    Each sequence holds token 1 and token 2 once each, at random distinct positions,
    and filler tokens ``3 .. vocab-1`` elsewhere.  A model without positional
    information sees the same multiset either way and cannot beat chance.

    Returns
    -------
    tokens : torch.Tensor
        ``(batch, seq_len)`` int64.
    labels : torch.Tensor
        ``(batch,)`` int64, 1 when token 1 precedes token 2.
    """
    batch = check_int("batch", batch, minimum=1)
    seq_len = check_int("seq_len", seq_len, minimum=2)
    vocab = check_int("vocab", vocab, minimum=4)
    tokens = torch.randint(3, vocab, (batch, seq_len), generator=generator)
    order = torch.rand(batch, seq_len, generator=generator).argsort(-1)[:, :2]
    rows = torch.arange(batch)
    tokens[rows, order[:, 0]] = 1
    tokens[rows, order[:, 1]] = 2
    labels = (order[:, 0] < order[:, 1]).long()
    return tokens.to(device), labels.to(device)


class OrderModel(torch.nn.Module):
    """One attention layer on token embeddings plus the fixed sinusoidal table.

    ``inputs(tokens) = E[tokens] + P`` with ``P = sinusoidal_table(seq_len, dim)``;
    :meth:`readout` maps inputs ``(..., seq_len, dim)`` to a score ``(...,)``
    (the logit of "token 1 first"): single-head attention without mask, mean
    pooling, a tanh hidden layer and a linear readout.  Everything is float64 by
    default so its Hessians are exact to roundoff.
    """

    positions: torch.Tensor  # the buffer registered in __init__

    def __init__(
        self,
        vocab: int,
        dim: int,
        seq_len: int,
        *,
        dtype: torch.dtype = torch.float64,
        device: Device = None,
    ) -> None:
        super().__init__()
        vocab = check_int("vocab", vocab, minimum=1)
        dim = check_even("dim", dim)
        seq_len = check_int("seq_len", seq_len, minimum=1)
        self.embedding = torch.nn.Embedding(vocab, dim, dtype=dtype, device=device)
        self.qkv = torch.nn.Linear(dim, 3 * dim, dtype=dtype, device=device)
        self.hidden = torch.nn.Linear(dim, dim, dtype=dtype, device=device)
        self.out = torch.nn.Linear(dim, 1, dtype=dtype, device=device)
        self.register_buffer(
            "positions", sinusoidal_table(seq_len, dim, dtype=dtype, device=device)
        )

    def inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        """``E[tokens] + P``: ``(..., seq_len)`` int64 -> ``(..., seq_len, dim)``."""
        embedded: torch.Tensor = self.embedding(tokens)  # (nn.Module.__call__ is untyped)
        return embedded + self.positions

    def readout(self, x: torch.Tensor) -> torch.Tensor:
        """Score ``(...,)`` of inputs ``x: (..., seq_len, dim)``: the f of the expansion."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        pooled = attention(q, k, v).mean(-2)
        score: torch.Tensor = self.out(torch.tanh(self.hidden(pooled)))
        return score.squeeze(-1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.readout(self.inputs(tokens))


def train_order_model(
    *,
    vocab: int = 12,
    dim: int = 16,
    seq_len: int = 8,
    steps: int = 150,
    batch: int = 64,
    lr: float = 1e-2,
    seed: int = 0,
    device: Device = None,
) -> tuple[OrderModel, list[float]]:
    """Train :class:`OrderModel` on :func:`order_task_batch` (float64, Adam, deterministic).

    The model's initial weights and every batch come from generators seeded with
    ``seed``, so two runs on the same device give the same model.  Returns the
    model and the training loss (binary cross-entropy) at each step.
    """
    steps = check_int("steps", steps, minimum=1)
    seed = check_int("seed", seed)
    lr = check_float("lr", lr, positive=True)
    with torch.random.fork_rng(devices=[]):  # seed the initial weights, leave global RNG alone
        torch.manual_seed(seed)
        model = OrderModel(vocab, dim, seq_len, device=device)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses: list[float] = []
    for _ in range(steps):
        tokens, labels = order_task_batch(batch, seq_len, vocab, generator=gen, device=device)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(tokens), labels.to(torch.float64)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses
