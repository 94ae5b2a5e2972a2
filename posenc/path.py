"""PaTH attention: data-dependent Householder transforms between a key and its query.

PaTH (:cite:t:`yang2025path`) replaces RoPE's fixed rotation by the product of
the transforms of the tokens between a key and its query.  Token ``t`` carries a
unit direction ``w_t`` and a strength ``beta_t`` in ``[0, 2]``, and defines
``H_t = I - beta_t w_t w_t^T`` (a reflection through the mirror orthogonal to
``w_t`` for ``beta_t = 2``, the identity for ``beta_t = 0``).  Query ``i``
scores key ``j <= i`` with

    ``s_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j``

(the key's own transform and earlier ones are not applied; ``s_ii = q_i . k_i``),
the order and range of ``fla.ops.path_attn.naive.naive_path_attn`` of
flash-linear-attention 0.6.0, which the tests compare with.  Decoding is then
an update of the cached keys: when token ``t`` arrives, every cached key becomes
``H_t k`` (:class:`PathKVCache`).  RoPE is the case of fixed transforms: two
reflections compose to a rotation by twice the angle between their mirrors.

PaTH-FoX adds the Forgetting Transformer's gate: with ``F_t`` the cumulative
sum of ``log f_t`` (``log f_t <= 0``), the score gains ``F_i - F_j``.  The
released code (``parallel_path_attn`` and ``naive_path_attn``) adds it *before*
the softmax scale, ``scale * (s_ij + F_i - F_j)``; the Forgetting
Transformer's own code adds it after, ``scale * s_ij + F_i - F_j``.  posenc
follows PaTH's code by default (``scale_gate=True``); ``scale_gate=False``
gives FoX's convention.

Where posenc goes beyond the paper, which is causal: a key *after* its query
(``causal=False``) is scored by the same rule with the roles exchanged,
``s_ij = k_j^T H_j ... H_{i+1} q_i``, so the score is the same bilinear form
whichever token comes first (RoPE's extension to both directions when the
transforms are rotations), and the gate is ``-|F_i - F_j|``.

Cost (eager, exact, vectorised; ``n`` tokens, head size ``d``, per head):
:func:`path_attention` (tokens ``0 .. n-1``, causal) cuts the tokens into chunks of
64, solves each chunk's triangular system (the compact WY form of a product of
Householder transforms) and carries the queries across whole chunks as ``d x d``
products: ``O(n^2 d (1 + d / 64))`` time, ``O(n^2)`` memory (the scores, as explicit
attention).  The scheme, which takes any positions and both directions, solves one
``L x L`` triangular system over the ``L`` tokens of its bound input:
``O(L^2 (d + n))`` time, ``O(L n)`` memory beside the scores (cubic time at
``n = L``); so do :class:`PathKVCache`'s updates of several tokens at once.
flash-linear-attention's Triton kernels fuse the chunked algorithm; posenc has no
fused path (``backend="flex"`` refuses PaTH).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_build_args, check_floating, check_int
from ._runtime import has_values
from .context import CallContext
from .scheme import PositionalScheme
from .sdpa import repeat_kv, softmax_weights

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["PathAttention", "PathGate", "PathKVCache", "path_attention"]


# ------------------------------------------------------------------ the products, in WY form


def _triangular(w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """``I + N`` with ``N[s, t] = beta_t (w_s . w_t)`` for ``t < s``: ``(..., L, L)``.

    Carrying a vector ``x`` through ``H_{a+1}``, ``H_{a+2}``, ... takes off
    ``beta_s w_s c_s`` at step ``s``, with ``c_s = w_s . x - sum_{a < t < s} N[s, t]
    c_t``: the forward substitution of this unit lower-triangular system.
    """
    n = (w @ w.mT) * beta[..., None, :]
    eye = torch.eye(w.shape[-2], dtype=w.dtype, device=w.device)
    return n.tril(-1) + eye


def _coefficients(
    x: torch.Tensor, w: torch.Tensor, tri: torch.Tensor, pos: torch.Tensor
) -> torch.Tensor:
    """``c[..., j, s]``: the coefficient of ``w_s`` when carrying ``x_j`` from ``pos_j`` through s.

    ``x`` ``(..., n, d)``, ``pos`` broadcastable to ``(..., n)``; zero for ``s <=
    pos_j``.  A principal block of the inverse of a triangular matrix is the
    inverse of the block, so one solve serves every starting position.
    """
    after = torch.arange(w.shape[-2], device=w.device) > pos[..., None]
    rhs = ((x @ w.mT) * after).mT
    c: torch.Tensor = torch.linalg.solve_triangular(tri, rhs, upper=False, unitriangular=True)
    return c.mT


def _scores(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    *,
    both_ways: bool,
) -> torch.Tensor:
    """Unscaled PaTH scores ``(..., q_len, k_len)`` of tensors that share their heads.

    ``q_pos`` and ``k_pos`` broadcast to ``(..., q_len)`` and ``(..., k_len)``: the
    index of each token among the ``L`` transforms.  A key before its query:
    ``q . k - sum_{k_pos < s <= q_pos} beta_s (q . w_s) c_s(k)``; ``both_ways``
    adds the mirror image for keys after their query.
    """
    tri = _triangular(w, beta)
    steps = torch.arange(w.shape[-2], device=w.device)
    ck = _coefficients(k, w, tri, k_pos)
    upto_q = steps <= q_pos[..., None]
    s = q @ k.mT - ((q @ w.mT) * beta[..., None, :] * upto_q) @ ck.mT
    if both_ways:
        cq = _coefficients(q, w, tri, q_pos)
        upto_k = steps <= k_pos[..., None]
        s = s - cq @ ((k @ w.mT) * beta[..., None, :] * upto_k).mT
    return s


CHUNK = 64


def _chunked_scores(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor, chunk: int = CHUNK
) -> torch.Tensor:
    """The causal scores of :func:`_scores` for tokens ``0 .. L-1``, in ``O(L^2 d)`` time.

    Same heads for all four (``(..., L, d)`` and ``beta`` ``(..., L)``).  Tokens are cut
    into chunks of ``chunk``: within a chunk, the triangular system of that chunk;
    across chunks, each key is carried to the end of its chunk, each query back to the
    start of its own, and the query then through the ``d x d`` product of every whole
    chunk between them, one chunk per step.  Entries above the diagonal are zero.
    """
    length = q.shape[-2]
    nc = -(-length // chunk)
    pad = nc * chunk - length
    if pad:  # padding tokens: w = 0, beta = 0, the identity
        q, k, w = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, w))
        beta = F.pad(beta, (0, pad))
    lead = q.shape[:-2]
    q, k, w = (t.reshape(*lead, nc, chunk, t.shape[-1]) for t in (q, k, w))
    beta = beta.reshape(*lead, nc, chunk)
    wb = w * beta[..., None]
    ww = w @ wb.mT  # beta_t (w_s . w_t)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    lower, upper = ww.tril(-1) + eye, ww.triu(1) + eye
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)  # t > j
    # keys carried through the rest of their chunk: coefficients c[j, s] for s > j
    ck = torch.linalg.solve_triangular(
        lower, ((k @ w.mT) * later).mT, upper=False, unitriangular=True
    ).mT
    k_end = k - (ck * beta[..., None, :]) @ w
    # scores within a chunk: q . k - sum_{j < s <= i} beta_s (q_i . w_s) c[j, s]
    qw = q @ w.mT
    local = q @ k.mT - (qw * beta[..., None, :] * ~later) @ ck.mT
    # queries carried back to the start of their chunk (H_i first, then H_{i-1}, ...)
    eq = torch.linalg.solve_triangular(
        upper, (qw * ~later).mT, upper=True, unitriangular=True
    ).mT  # fmt: skip
    u = q - (eq * beta[..., None, :]) @ w
    # each chunk's whole product P = I - W^T diag(beta) (I + N)^{-1} W, d x d; a query
    # (a row vector u) crosses a chunk as u -> u P
    through = torch.linalg.solve_triangular(lower, w, upper=False, unitriangular=True)
    whole = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device) - w.mT @ (
        through * beta[..., None]
    )
    s = q.new_zeros(*lead, nc, chunk, nc, chunk)
    diag = torch.arange(nc, device=q.device)
    s[..., diag, :, diag, :] = local.movedim(-3, 0)
    u = u[..., 1:, :, :]
    for gap in range(1, nc):  # key chunk a - gap for query chunk a
        if gap > 1:
            u = u[..., 1:, :, :] @ whole[..., 1 : nc - gap + 1, :, :]
        block = u @ k_end[..., : nc - gap, :, :].mT
        s[..., diag[gap:], :, diag[: nc - gap], :] = block.movedim(-3, 0)
    return s.reshape(*lead, nc * chunk, nc * chunk)[..., :length, :length]


def _carried_to_end(
    k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor, chunk: int = CHUNK
) -> torch.Tensor:
    """Each key ``j`` of tokens ``0 .. L-1`` carried through ``H_{j+1} .. H_{L-1}``, by chunks.

    ``O(L d (chunk + d) + (L / chunk) d^3)``: within its chunk by the chunk's
    triangular system, then through the ``d x d`` product of every later chunk.
    """
    length = k.shape[-2]
    nc = -(-length // chunk)
    pad = nc * chunk - length
    if pad:
        k, w = (F.pad(t, (0, 0, 0, pad)) for t in (k, w))
        beta = F.pad(beta, (0, pad))
    lead = k.shape[:-2]
    k, w = (t.reshape(*lead, nc, chunk, t.shape[-1]) for t in (k, w))
    beta = beta.reshape(*lead, nc, chunk)
    eye = torch.eye(chunk, dtype=k.dtype, device=k.device)
    lower = (w @ (w * beta[..., None]).mT).tril(-1) + eye
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=k.device).triu(1)
    ck = torch.linalg.solve_triangular(
        lower, ((k @ w.mT) * later).mT, upper=False, unitriangular=True
    ).mT
    k_end = k - (ck * beta[..., None, :]) @ w
    through = torch.linalg.solve_triangular(lower, w, upper=False, unitriangular=True)
    whole = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device) - w.mT @ (
        through * beta[..., None]
    )
    # rows cross chunk b as x -> x P_b^T; suffix products from the last chunk backwards
    suffix = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device).expand(
        whole.shape[:-3] + (k.shape[-1],) * 2
    )
    parts = [k_end[..., nc - 1, :, :]]
    for b in range(nc - 2, -1, -1):
        suffix = whole[..., b + 1, :, :].mT @ suffix
        parts.append(k_end[..., b, :, :] @ suffix)
    carried = torch.stack(parts[::-1], dim=-3)
    return carried.reshape(*lead, nc * chunk, k.shape[-1])[..., :length, :]


def _gate(
    cum: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, shape: torch.Size
) -> torch.Tensor:
    """``F_i - F_j`` for keys at or before their query, ``F_j - F_i`` after: ``-|F_i - F_j|``."""
    lead = shape[:-2]
    fq = cum.expand(*lead, cum.shape[-1]).gather(-1, q_pos.expand(*lead, shape[-2]))
    fk = cum.expand(*lead, cum.shape[-1]).gather(-1, k_pos.expand(*lead, shape[-1]))
    diff = fq[..., :, None] - fk[..., None, :]
    before = k_pos[..., None, :] <= q_pos[..., :, None]
    return torch.where(before, diff, -diff)


def _unit(w: torch.Tensor) -> torch.Tensor:
    """``w / |w|`` along the last dimension (a zero row gives NaN, never a silent zero)."""
    norm: torch.Tensor = torch.linalg.vector_norm(w, dim=-1, keepdim=True)
    return w / norm


# ------------------------------------------------------------------ the function


def _check_transforms(
    w: torch.Tensor,
    beta: torch.Tensor,
    log_f: torch.Tensor | None,
    *,
    batch: int,
    heads: int,
    length: int,
    head_dim: int,
    device: torch.device,
) -> None:
    """Shapes and (when readable) values of ``w``, ``beta`` and ``log_f``."""
    if w.dim() != 4 or w.shape[2] != length or w.shape[3] != head_dim:
        raise ValueError(
            f"w must have shape (batch, w_heads, length, head_dim) = (batch, w_heads, "
            f"{length}, {head_dim}), got {tuple(w.shape)}"
        )
    if w.shape[0] not in (1, batch):
        raise ValueError(f"w must have batch {batch} or 1, got shape {tuple(w.shape)}")
    if w.shape[1] == 0 or heads % w.shape[1]:
        raise ValueError(
            f"w_heads (w.shape[1] = {w.shape[1]}) must divide the query heads ({heads})"
        )
    if beta.shape != w.shape[:3]:
        raise ValueError(
            f"beta must have shape (batch, w_heads, length) = {tuple(w.shape[:3])} as w, "
            f"got {tuple(beta.shape)}"
        )
    for name, t in (("w", w), ("beta", beta), ("log_f", log_f)):
        if t is not None and t.device != device:
            raise ValueError(f"{name} must be on q's device {device}, got {t.device}")
    if log_f is not None and (
        log_f.dim() != 3 or log_f.shape[0] not in (1, batch) or log_f.shape[1:] != (heads, length)
    ):
        raise ValueError(
            f"log_f must have shape (batch, heads, length) = ({batch}, {heads}, {length}) "
            f"(or batch 1), got {tuple(log_f.shape)}"
        )
    if has_values(w) and bool((torch.linalg.vector_norm(w, dim=-1) == 0).any()):
        raise ValueError("w must have no zero vector: each w_t is a direction (it is normalised)")
    if has_values(beta) and not bool(((beta >= 0) & (beta <= 2)).all()):
        raise ValueError(
            "beta must lie in [0, 2] (each H_t = I - beta w w^T is then a contraction), "
            f"got values in [{beta.min().item():.4g}, {beta.max().item():.4g}]"
        )
    if log_f is not None and has_values(log_f) and not bool((log_f <= 0).all()):
        raise ValueError(
            f"log_f must be <= 0 (the log of a forget gate in (0, 1]), got a maximum of "
            f"{log_f.max().item():.4g}"
        )


def path_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    *,
    log_f: torch.Tensor | None = None,
    scale: float | None = None,
    scale_gate: bool = True,
) -> torch.Tensor:
    """Causal PaTH attention (PaTH-FoX with ``log_f``) over one sequence, eager and exact.

    ``softmax_j(scale * (q_i^T H_i ... H_{j+1} k_j + F_i - F_j)) v_j`` over
    ``j <= i``, with ``H_t = I - beta_t w_t w_t^T`` and ``F`` the cumulative sum
    of ``log_f`` (see the module docstring).

    Parameters
    ----------
    q
        Queries ``(batch, heads, length, d)``.
    k, v
        Keys ``(batch, kv_heads, length, d)`` and values ``(batch, kv_heads,
        length, d_v)``; ``kv_heads`` divides ``heads`` (query head ``h`` uses key
        head ``h // (heads // kv_heads)``).
    w
        Directions ``(batch|1, w_heads, length, d)``, ``w_heads`` dividing
        ``heads`` (query head ``h`` uses ``h // (heads // w_heads)``;
        flash-linear-attention's layer has ``w_heads = kv_heads``).  Each ``w_t``
        is divided by its norm here, in the working precision, so only its
        direction matters; a zero vector is refused.
    beta
        Strengths ``(batch|1, w_heads, length)`` in ``[0, 2]`` (the paper's
        ``2 * sigmoid``; refused outside, where the products could grow).
    log_f
        Optional log forget gates ``(batch|1, heads, length)``, ``<= 0``: PaTH-FoX.
    scale
        Multiplier of the scores, default ``1 / sqrt(d)``.
    scale_gate
        ``True`` (PaTH's code): ``scale * (score + F_i - F_j)``; ``False`` (the
        Forgetting Transformer's code): ``scale * score + F_i - F_j``.

    Returns
    -------
    Tensor
        ``(batch, heads, length, d_v)`` in ``q``'s dtype, computed in float32 at
        least (float64 for float64 inputs).  Memory: ``O(heads * length**2)``
        (the scores); time ``O(heads * length**2 * d * (1 + d / 64))``.

    Examples
    --------
    >>> import torch, posenc
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 1, 2, 5, 4, generator=g, dtype=torch.float64)
    >>> w = torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64)
    >>> beta = 2 * torch.rand(1, 2, 5, generator=g, dtype=torch.float64)
    >>> out = posenc.path_attention(q, k, v, w, beta)
    >>> out.shape
    torch.Size([1, 2, 5, 4])

    With ``beta = 0`` every transform is the identity: plain causal attention.

    >>> plain = posenc.path_attention(q, k, v, w, torch.zeros_like(beta))
    >>> torch.allclose(plain, posenc.attention(q, k, v, causal=True))
    True
    """
    q = check_floating("q", q)
    k = check_floating("k", k)
    v = check_floating("v", v)
    w = check_floating("w", w)
    beta = check_floating("beta", beta)
    if log_f is not None:
        log_f = check_floating("log_f", log_f)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k and v must be 4-D (batch, heads, length, features), got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    batch, heads, length, d = q.shape
    if k.shape[0] != batch or k.shape[2:] != (length, d) or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"k (batch, kv_heads, length, d) and v (batch, kv_heads, length, d_v) must match "
            f"q {tuple(q.shape)} in batch and length (k also in d), got {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if k.shape[1] == 0 or heads % k.shape[1]:
        raise ValueError(f"kv_heads (k.shape[1] = {k.shape[1]}) must divide heads ({heads})")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}"
        )
    _check_transforms(
        w, beta, log_f, batch=batch, heads=heads, length=length, head_dim=d, device=q.device
    )
    if not isinstance(scale_gate, bool):
        raise TypeError(f"scale_gate must be True or False, got {scale_gate!r}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    work = torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.float32)
    pos = torch.arange(length, device=q.device)
    s = _chunked_scores(
        q.to(work), repeat_kv(k.to(work), heads),
        repeat_kv(_unit(w.to(work)), heads), repeat_kv(beta.to(work)[..., None], heads)[..., 0],
    )  # fmt: skip
    logits = _logits(s, log_f, pos, pos, scale, scale_gate)
    weights = softmax_weights(logits, causal=True, q_offset=0)
    return (weights @ repeat_kv(v.to(work), heads)).to(q.dtype)


def _logits(
    s: torch.Tensor,
    log_f: torch.Tensor | None,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    scale_gate: bool,
) -> torch.Tensor:
    """Scaled logits from the unscaled scores and the optional forget gate."""
    if log_f is None:
        return scale * s
    gate = _gate(log_f.to(s.dtype).cumsum(-1), q_pos, k_pos, s.shape)
    return scale * (s + gate) if scale_gate else scale * s + gate


# ------------------------------------------------------------------ w and beta from the input


class PathGate(nn.Module):
    """The paper's ``w``, ``beta`` (and PaTH-FoX's ``log f``) from a layer input ``x``.

    As in ``fla/layers/path_attn.py`` (class ``PaTHAttention``) of
    flash-linear-attention 0.6.0: ``w`` is a low-rank projection
    ``model_dim -> rank -> kv_heads * head_dim`` (or a full one with ``rank=None``),
    then a causal depthwise convolution of width ``conv_size`` with SiLU and no
    bias (fla's ``ShortConvolution``), then normalised per head; ``beta = 2 *
    sigmoid(x A + b)``, one per key/value head; ``log f = logsigmoid(x G + c)``,
    one per query head, with ``forget_gate=True``.  fla normalises with
    ``x / sqrt(|x|^2 + 1e-6)``; posenc divides by the norm exactly (unit ``w``).

    Parameters
    ----------
    model_dim
        Width of the layer input ``x``.
    num_heads
        Query heads (the heads of ``log f``).
    head_dim
        Size of ``w``, the head size of queries and keys.
    kv_heads
        Heads of ``w`` and ``beta``, dividing ``num_heads``; default
        ``num_heads``.  fla shares them with the key/value heads.
    rank
        Inner width of the low-rank projection of ``w`` (fla: 32); ``None`` for
        a full projection (fla's ``use_low_rank_w=False``).
    conv_size
        Width of the causal convolution (fla: 3); 1 is a per-channel scale.
    forget_gate
        Also produce ``log f`` (PaTH-FoX).

    Examples
    --------
    >>> import torch, posenc
    >>> _ = torch.manual_seed(0)
    >>> gate = posenc.PathGate(32, num_heads=4, head_dim=8, kv_heads=2, forget_gate=True)
    >>> w, beta, log_f = gate(torch.randn(3, 10, 32))
    >>> w.shape, beta.shape, log_f.shape
    (torch.Size([3, 2, 10, 8]), torch.Size([3, 2, 10]), torch.Size([3, 4, 10]))
    >>> bool(torch.allclose(w.norm(dim=-1), torch.ones(3, 2, 10)))
    True
    >>> bool(((beta > 0) & (beta < 2)).all()), bool((log_f < 0).all())
    (True, True)
    """

    def __init__(
        self,
        model_dim: int,
        num_heads: int,
        head_dim: int,
        *,
        kv_heads: int | None = None,
        rank: int | None = 32,
        conv_size: int = 3,
        forget_gate: bool = False,
    ) -> None:
        super().__init__()
        self.model_dim = check_int("model_dim", model_dim, minimum=1)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.kv_heads = (
            self.num_heads if kv_heads is None else check_int("kv_heads", kv_heads, minimum=1)
        )
        if self.num_heads % self.kv_heads:
            raise ValueError(
                f"kv_heads must divide num_heads = {self.num_heads}, got {self.kv_heads}"
            )
        self.rank = None if rank is None else check_int("rank", rank, minimum=1)
        self.conv_size = check_int("conv_size", conv_size, minimum=1)
        if not isinstance(forget_gate, bool):
            raise TypeError(f"forget_gate must be True or False, got {forget_gate!r}")
        width = self.kv_heads * self.head_dim
        self.w_proj: nn.Module
        if self.rank is None:
            self.w_proj = nn.Linear(self.model_dim, width, bias=False)
        else:
            self.w_proj = nn.Sequential(
                nn.Linear(self.model_dim, self.rank, bias=False),
                nn.Linear(self.rank, width, bias=False),
            )
        self.w_conv = nn.Conv1d(
            width, width, self.conv_size, padding=self.conv_size - 1, groups=width, bias=False
        )
        self.beta_proj = nn.Linear(self.model_dim, self.kv_heads)
        self.f_proj = nn.Linear(self.model_dim, self.num_heads) if forget_gate else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(w, beta, log_f)`` for ``x`` ``(batch, length, model_dim)``.

        Parameters
        ----------
        x
            The attention layer's input, ``(batch, length, model_dim)``.

        Returns
        -------
        tuple
            ``w`` ``(batch, kv_heads, length, head_dim)`` of unit norm, ``beta``
            ``(batch, kv_heads, length)`` in ``(0, 2)`` and ``log_f`` ``(batch,
            num_heads, length)`` (``None`` without ``forget_gate``).  Token ``t``
            depends on ``x`` at ``t - conv_size + 1 .. t`` only.
        """
        x = check_floating("x", x)
        if x.dim() != 3 or x.shape[-1] != self.model_dim:
            raise ValueError(
                f"x must have shape (batch, length, model_dim={self.model_dim}), "
                f"got {tuple(x.shape)}"
            )
        batch, length, _ = x.shape
        w = self.w_proj(x).mT  # (batch, channels, length) for the convolution
        w = F.silu(self.w_conv(w)[..., :length])  # left padding only: causal
        w = w.view(batch, self.kv_heads, self.head_dim, length).mT
        w = F.normalize(w, dim=-1, eps=torch.finfo(w.dtype).tiny)
        beta = 2 * torch.sigmoid(self.beta_proj(x)).mT
        log_f = None if self.f_proj is None else F.logsigmoid(self.f_proj(x)).mT
        return w, beta, log_f

    def extra_repr(self) -> str:
        return (
            f"model_dim={self.model_dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"kv_heads={self.kv_heads}, rank={self.rank}, conv_size={self.conv_size}"
        )


# ------------------------------------------------------------------ the registered scheme


class PathAttention(PositionalScheme):
    """PaTH (and PaTH-FoX) as a scheme: bind it to the layer input, then attend.

    The transforms come from the attention layer's input ``x``, which
    :func:`posenc.attention` does not see: ``scheme.bind(x)`` computes ``w``,
    ``beta`` (and ``log f``) with the scheme's :class:`PathGate` and returns a
    bound scheme for one call, ``posenc.attention(q, k, v,
    encoding=scheme.bind(x), causal=True)``.  Calling attention with the
    unbound scheme raises.  Positions index the tokens of ``x``: a query or key
    at position ``p`` is token ``p`` of the bound input (``0 <= p < length``),
    and ``H_{p_j+1} .. H_{p_i}`` are the transforms between them.  A key after
    its query (``causal=False``) is scored with the roles exchanged (module
    docstring).  ``w`` and ``beta`` have ``kv_heads`` heads (fla's layer) and
    ``log f`` one per query head.  Eager only (``backend="flex"`` refuses).

    Parameters
    ----------
    num_heads
        Query heads.
    head_dim
        Size of queries and keys.
    model_dim
        Width of the layer input; default ``num_heads * head_dim``.
    kv_heads
        Heads of ``w`` and ``beta`` (set it to the model's key/value heads as fla
        does); default ``num_heads``.
    rank, conv_size
        Of :class:`PathGate` (fla: 32 and 3).
    forget_gate
        PaTH-FoX: a forget gate per query head.
    scale_gate
        Add the gate before the softmax scale (``True``, PaTH's code) or after
        (``False``, the Forgetting Transformer's code).

    Examples
    --------
    >>> import torch, posenc
    >>> _ = torch.manual_seed(0)
    >>> path = posenc.PathAttention(4, 8, forget_gate=True)       # model_dim 32
    >>> x = torch.randn(2, 6, 32)                                 # the layer input
    >>> q = torch.randn(2, 4, 6, 8)
    >>> k, v = torch.randn(2, 2, 2, 6, 8)                         # 2 key/value heads
    >>> out = posenc.attention(q, k, v, encoding=path.bind(x), causal=True)
    >>> out.shape
    torch.Size([2, 4, 6, 8])

    It is :func:`posenc.path_attention` with the gate's transforms:

    >>> w, beta, log_f = path.gate(x)
    >>> same = posenc.path_attention(q, k, v, w, beta, log_f=log_f)
    >>> torch.allclose(out, same, atol=1e-6)
    True
    """

    reads_input = True
    quadratic_memory = True
    reference = "yang2025path"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        model_dim: int | None = None,
        kv_heads: int | None = None,
        rank: int | None = 32,
        conv_size: int = 3,
        forget_gate: bool = False,
        scale_gate: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.model_dim = (
            self.num_heads * self.head_dim
            if model_dim is None
            else check_int("model_dim", model_dim, minimum=1)
        )
        if not isinstance(scale_gate, bool):
            raise TypeError(f"scale_gate must be True or False, got {scale_gate!r}")
        self.scale_gate = scale_gate
        self.gate: PathGate | None = PathGate(
            self.model_dim, self.num_heads, self.head_dim, kv_heads=kv_heads, rank=rank,
            conv_size=conv_size, forget_gate=forget_gate,
        )  # fmt: skip
        self.w: torch.Tensor | None
        self.beta: torch.Tensor | None
        self.log_f: torch.Tensor | None
        # the bound transforms: buffers (so .to() moves them), not saved in state_dict
        self.register_buffer("w", None, persistent=False)
        self.register_buffer("beta", None, persistent=False)
        self.register_buffer("log_f", None, persistent=False)

    @property
    def bound(self) -> bool:
        """Whether this instance holds the transforms of one input (made by :meth:`bind`)."""
        return self.w is not None

    def bind(self, x: torch.Tensor) -> PathAttention:
        """A scheme for one attention call on the layer input ``x``.

        Parameters
        ----------
        x
            The attention layer's input ``(batch, length, model_dim)``.

        Returns
        -------
        PathAttention
            An instance of the same class holding ``w``, ``beta`` and ``log f``
            of ``x`` as tensors (gradients reach the gate's parameters through
            them); it has no parameters of its own.
        """
        if self.gate is None:
            raise ValueError("bind() needs the unbound scheme: this one is already bound")
        w, beta, log_f = self.gate(x)
        return self._bound_to(w, beta, log_f)

    def _bound_to(
        self, w: torch.Tensor, beta: torch.Tensor, log_f: torch.Tensor | None
    ) -> PathAttention:
        bound = type(self).__new__(type(self))
        # super(), not nn.Module.__init__(bound): Dynamo traces the former, and refuses the
        # latter (a function it skips), so a model that binds in its forward compiles whole
        super(PathAttention, bound).__init__()
        bound.num_heads, bound.head_dim = self.num_heads, self.head_dim
        bound.model_dim, bound.scale_gate = self.model_dim, self.scale_gate
        bound.gate = None
        bound.reads_input = False  # bound: attention may run it, binding again is refused
        bound.register_buffer("w", w, persistent=False)
        bound.register_buffer("beta", beta, persistent=False)
        bound.register_buffer("log_f", log_f, persistent=False)
        return bound

    # --- hooks ----------------------------------------------------------------------------

    def logits(self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext) -> torch.Tensor:
        """Scaled PaTH logits ``(batch, heads, q_len, k_len)`` at the context's positions.

        Float32 at least (float64 for float64 inputs or transforms), before masking.
        """
        w, beta = self.w, self.beta
        if w is None or beta is None:
            raise ValueError(
                f"{type(self).__name__} reads the attention layer's input: call "
                f"scheme.bind(x) with x (batch, length, model_dim={self.model_dim}) and pass "
                f"the bound scheme as encoding"
            )
        batch, heads, length = ctx.batch, ctx.heads, w.shape[-2]
        if w.shape[0] not in (1, batch) or heads % w.shape[1] or w.shape[-1] != ctx.head_dim:
            raise ValueError(
                f"the bound input gives w of shape {tuple(w.shape)} (batch, w_heads, length, "
                f"head_dim), which does not fit q with batch {batch}, {heads} heads and "
                f"head_dim {ctx.head_dim} (batch must agree or be 1, w_heads must divide heads)"
            )
        q_pos = _positions("q_positions", ctx.q_positions, length)
        k_pos = _positions("k_positions", ctx.k_positions, length)
        work = torch.promote_types(torch.promote_types(q.dtype, w.dtype), torch.float32)
        s = _scores(
            q.to(work), repeat_kv(k.to(work), heads), repeat_kv(w.to(work), heads),
            repeat_kv(beta.to(work)[..., None], heads)[..., 0],
            q_pos.clamp(0, length - 1), k_pos.clamp(0, length - 1), both_ways=True,
        )  # fmt: skip
        log_f = None if self.log_f is None else self.log_f.to(work)
        out = _logits(s, log_f, q_pos.clamp(0, length - 1), k_pos.clamp(0, length - 1),
                      ctx.scale, self.scale_gate)  # fmt: skip
        # positions past the bound input (only reachable while tracing): NaN, never a guess
        bad = _outside(q_pos, length)[..., :, None] | _outside(k_pos, length)[..., None, :]
        return torch.where(bad, torch.nan, out)

    def _masked_logits(self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext) -> torch.Tensor:
        """:meth:`logits`, or the same entries on and below the diagonal by chunks.

        A causal call over the bound input's own tokens (positions ``0 .. L-1``
        for queries and keys) needs no entry above the diagonal, so it takes
        :func:`_chunked_scores`, ``O(L^2 d)`` instead of one ``O(L^3)`` solve;
        the entries it leaves at zero are masked by the causal mask.
        """
        w, beta = self.w, self.beta
        length = -1 if w is None else w.shape[-2]
        if not (
            w is not None and beta is not None and ctx.causal and ctx.q_offset == 0
            and q.shape[-2] == k.shape[-2] == length
            and _is_arange(ctx.q_positions, length) and _is_arange(ctx.k_positions, length)
            and w.shape[0] in (1, ctx.batch) and w.shape[-1] == ctx.head_dim
            and ctx.heads % w.shape[1] == 0
        ):  # fmt: skip
            return self.logits(q, k, ctx)
        heads = ctx.heads
        work = torch.promote_types(torch.promote_types(q.dtype, w.dtype), torch.float32)
        s = _chunked_scores(
            q.to(work), repeat_kv(k.to(work), heads), repeat_kv(w.to(work), heads),
            repeat_kv(beta.to(work)[..., None], heads)[..., 0],
        )  # fmt: skip
        pos = torch.arange(length, device=q.device)
        log_f = None if self.log_f is None else self.log_f.to(work)
        return _logits(s, log_f, pos, pos, ctx.scale, self.scale_gate)

    def weights(self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext) -> torch.Tensor:
        """The softmax of :meth:`logits` under the call's masks, in ``q``'s dtype."""
        w = softmax_weights(
            self._masked_logits(q, k, ctx), mask=ctx.mask, causal=ctx.causal,
            q_offset=ctx.q_offset,
        )  # fmt: skip
        return w.to(q.dtype)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: CallContext
    ) -> torch.Tensor:
        """``weights @ v``, ``(batch, heads, q_len, d_v)``."""
        w = softmax_weights(
            self._masked_logits(q, k, ctx), mask=ctx.mask, causal=ctx.causal,
            q_offset=ctx.q_offset,
        )  # fmt: skip
        return (w @ repeat_kv(v, q.shape[-3]).to(w.dtype)).to(q.dtype)

    # --- registry -------------------------------------------------------------------------

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
        """An unbound instance (``max_len`` is not needed); ``options`` go to the constructor."""
        num_heads, head_dim, max_len = check_build_args(num_heads, head_dim, max_len, causal)
        return cls(num_heads, head_dim, **options)

    @classmethod
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        """Bound to a fixed random input of 48 tokens (batch 1, shared by any batch).

        ``""``: PaTH; ``"fox"``: PaTH-FoX; ``"fox-after-scale-shared"``:
        PaTH-FoX with FoX's gate convention and one ``w`` head for all query heads.
        The gate's weights are drawn large so that ``beta`` spans ``(0, 2)`` and
        the forget gates matter.
        """
        g = torch.Generator().manual_seed(0)
        out: dict[str, PositionalScheme] = {}
        variants: dict[str, dict[str, Any]] = {
            "": {},
            "fox": {"forget_gate": True},
            "fox-after-scale-shared": {"forget_gate": True, "scale_gate": False, "kv_heads": 1},
        }
        for label, options in variants.items():
            scheme = cls(num_heads, head_dim, **options)
            assert scheme.gate is not None
            with torch.no_grad():
                for p in scheme.gate.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(max(p.shape[-1], 1)) * 2)
                x = torch.randn(1, 48, scheme.model_dim, generator=g)
                out[label] = scheme.bind(x)
        return out

    def extra_repr(self) -> str:
        state = f"bound to {self.w.shape[-2]} tokens" if self.w is not None else "unbound"
        return (
            f"num_heads={self.num_heads}, head_dim={self.head_dim}, model_dim={self.model_dim}, "
            f"scale_gate={self.scale_gate}, {state}"
        )


def _positions(name: str, pos: torch.Tensor, length: int) -> torch.Tensor:
    """Positions as ``(batch|1, 1, len)``; refused outside ``0 .. length-1`` when readable."""
    if pos.numel() and has_values(pos):
        lo, hi = torch.stack(torch.aminmax(pos)).tolist()
        if lo < 0 or hi >= length:
            raise ValueError(
                f"{name} must index the tokens of the bound input, 0 .. {length - 1}, "
                f"got values in [{lo}, {hi}]"
            )
    return pos.reshape(-1 if pos.dim() == 2 else 1, 1, pos.shape[-1])


def _is_arange(pos: torch.Tensor, length: int) -> bool:
    """Whether every row of ``pos`` is ``0 .. length-1`` (``False`` when unreadable)."""
    if pos.shape[-1] != length or not has_values(pos):
        return False
    return bool((pos == torch.arange(length, device=pos.device)).all())


def _outside(pos: torch.Tensor, length: int) -> torch.Tensor:
    return (pos < 0) | (pos >= length)


# ------------------------------------------------------------------ decoding


class PathKVCache:
    """Decoding with PaTH: the cached keys are transformed in place as tokens arrive.

    When token ``t`` arrives every cached key ``k`` becomes ``H_t k = k - beta_t
    (k . w_t) w_t`` (as fla's layer does when decoding), so that attending from a
    new query is plain attention on the cached keys: ``O(length * d)`` per token
    and head, and the keys stored once.  Several tokens at once (a prompt) are
    scored exactly among themselves and carried together, through the same
    triangular system as :func:`path_attention`: a prompt (the first update) by
    chunks, ``O(n^2 d)``; ``n`` tokens after cached ones by one ``n x n`` system.
    The gate's cumulative sum is kept too (PaTH-FoX).

    Keys are stored with ``lcm(kv_heads, w_heads)`` heads: ``kv_heads`` when
    ``w`` has the key heads (fla's layer), more when one key head meets several
    ``w`` heads.

    Parameters
    ----------
    scale
        Multiplier of the scores, default ``1 / sqrt(d)``.
    scale_gate
        As in :func:`path_attention`.

    Examples
    --------
    >>> import torch, posenc
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 1, 2, 7, 8, generator=g, dtype=torch.float64)
    >>> w = torch.randn(1, 2, 7, 8, generator=g, dtype=torch.float64)
    >>> beta = 2 * torch.rand(1, 2, 7, generator=g, dtype=torch.float64)
    >>> cache = posenc.PathKVCache()
    >>> prompt = cache.update(q[:, :, :4], k[:, :, :4], v[:, :, :4], w[:, :, :4], beta[:, :, :4])
    >>> steps = [cache.update(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1],
    ...                       w[:, :, t:t + 1], beta[:, :, t:t + 1]) for t in (4, 5, 6)]
    >>> full = posenc.path_attention(q, k, v, w, beta)
    >>> torch.allclose(torch.cat([prompt, *steps], dim=2), full)
    True
    """

    def __init__(self, *, scale: float | None = None, scale_gate: bool = True) -> None:
        if not isinstance(scale_gate, bool):
            raise TypeError(f"scale_gate must be True or False, got {scale_gate!r}")
        self.scale = scale
        self.scale_gate = scale_gate
        self.reset()

    def reset(self) -> None:
        """Forget every cached token."""
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._f: torch.Tensor | None = None  # cumulative log f of each cached token
        self._last: torch.Tensor | None = None  # cumulative log f of the newest token

    @property
    def length(self) -> int:
        """Number of cached tokens."""
        return 0 if self._k is None else self._k.shape[-2]

    @property
    def keys(self) -> torch.Tensor | None:
        """Cached keys ``(batch, lcm(kv_heads, w_heads), length, d)``, carried to the last token."""
        return self._k

    def update(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        w: torch.Tensor,
        beta: torch.Tensor,
        log_f: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend from ``n`` new tokens to every token so far, then carry the keys past them.

        Parameters
        ----------
        q, k, v
            The new tokens' queries ``(batch, heads, n, d)``, keys ``(batch,
            kv_heads, n, d)`` and values ``(batch, kv_heads, n, d_v)``.
        w, beta, log_f
            Their transforms, shaped as in :func:`path_attention` with length
            ``n`` (``log_f`` on every update or on none).

        Returns
        -------
        Tensor
            ``(batch, heads, n, d_v)``: the rows of the full causal pass
            (:func:`path_attention` over all the tokens) for the new tokens.
        """
        q = check_floating("q", q)
        k = check_floating("k", k)
        v = check_floating("v", v)
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise ValueError(
                f"q, k and v must be 4-D (batch, heads, n, features), got shapes "
                f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
            )
        batch, heads, n, d = q.shape
        if k.shape[0] != batch or k.shape[2:] != (n, d) or v.shape[:3] != k.shape[:3]:
            raise ValueError(
                f"k and v must match q {tuple(q.shape)} in batch and n (k also in d), "
                f"got {tuple(k.shape)}, {tuple(v.shape)}"
            )
        if k.shape[1] == 0 or heads % k.shape[1]:
            raise ValueError(f"kv_heads (k.shape[1] = {k.shape[1]}) must divide heads ({heads})")
        if n == 0:
            raise ValueError("q, k and v must hold at least one new token (n >= 1)")
        w = check_floating("w", w)
        beta = check_floating("beta", beta)
        if log_f is not None:
            log_f = check_floating("log_f", log_f)
        _check_transforms(
            w, beta, log_f, batch=batch, heads=heads, length=n, head_dim=d, device=q.device
        )
        if self._k is not None and (log_f is None) != (self._f is None):
            raise ValueError("log_f must be given on every update or on none (call reset())")
        work = torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.float32)
        stored = math.lcm(k.shape[1], w.shape[1])
        k_new = repeat_kv(k.to(work), stored)
        if self._k is not None:
            assert self._v is not None
            want = (batch, stored, d, v.shape[-1], work)
            got = (self._k.shape[0], self._k.shape[1], self._k.shape[-1], self._v.shape[-1],
                   self._k.dtype)  # fmt: skip
            if want != got:
                raise ValueError(
                    f"the new tokens must match the cache's (batch, key heads, d, d_v, dtype) "
                    f"{got}, got {want} (call reset() to start a new sequence)"
                )
        old = self.length
        keys = k_new if self._k is None else torch.cat((self._k, k_new), dim=-2)
        values = v.to(work) if self._v is None else torch.cat((self._v, v.to(work)), dim=-2)
        # in the new tokens' frame the old keys sit before the first of them (position -1)
        k_pos = torch.cat(
            (torch.full((old,), -1, device=q.device), torch.arange(n, device=q.device))
        )
        q_pos = torch.arange(n, device=q.device)
        wu = _unit(w.to(work))
        b = beta.to(work)
        args = (
            repeat_kv(keys, heads),
            repeat_kv(wu, heads),
            repeat_kv(b[..., None], heads)[..., 0],
        )
        if old == 0:  # a prompt: the chunked O(n^2 d) scores of path_attention
            s = _chunked_scores(q.to(work), *args)
        else:  # the old keys sit before the new tokens: one n x n system
            s = _scores(q.to(work), *args, q_pos, k_pos, both_ways=False)
        scale = 1.0 / math.sqrt(d) if self.scale is None else float(self.scale)
        cum = None
        if log_f is None:
            logits = scale * s
        else:
            start = self._last if self._last is not None else torch.zeros((), dtype=work)
            cum = start.to(q.device) + log_f.to(work).expand(batch, heads, n).cumsum(-1)
            f_keys = cum if self._f is None else torch.cat((self._f, cum), dim=-1)
            gate = cum[..., :, None] - f_keys[..., None, :]
            logits = scale * (s + gate) if self.scale_gate else scale * s + gate
        weights = softmax_weights(logits, causal=True, q_offset=old)
        out = (weights @ repeat_kv(values, heads)).to(q.dtype)
        # carry every key past the new tokens: k <- H_{last} ... k = k - sum_s beta_s c_s w_s
        ws, bs = repeat_kv(wu, stored), repeat_kv(b[..., None], stored)[..., 0]
        if old == 0:
            self._k = _carried_to_end(keys, ws, bs)
        else:
            c = _coefficients(keys, ws, _triangular(ws, bs), k_pos)
            self._k = keys - (c * bs[..., None, :]) @ ws
        self._v = values
        if cum is not None:
            self._f = cum if self._f is None else torch.cat((self._f, cum), dim=-1)
            self._last = cum[..., -1:]
        return out
