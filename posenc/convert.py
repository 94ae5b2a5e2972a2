"""Checkpoint conversion between the two RoPE feature layouts.

A model trained with one layout runs unchanged with the other once the output
rows of its query and key projections are permuted, head by head.  Within a
head of size ``d`` whose first ``r`` features rotate:

* ``"interleaved"`` (RoFormer, GPT-J, Meta's LLaMA) rotates pairs ``(2i, 2i+1)``;
* ``"half"`` (GPT-NeoX, LLaMA in Hugging Face transformers) rotates ``(i, i + r/2)``.

Pair ``i`` has frequency ``omega_i`` in both, so the conversion moves feature
``2i`` to slot ``i`` and ``2i+1`` to slot ``i + r/2``; features ``r..d-1``
stay.  Queries and keys are permuted identically, so every score ``q . k`` is
unchanged (the dot product is invariant under a shared permutation).  Values
and output projections are not rotated and need no change.  This is the
permutation Hugging Face's LLaMA conversion applies to Meta's checkpoints; it
is easy to get backwards (transformers#25199, flash-attention#288).
"""

from __future__ import annotations

import torch

from ._checks import check_choice, check_even, check_int, check_tensor

__all__ = ["rope_layout_permutation", "interleaved_to_half", "half_to_interleaved"]

_LAYOUTS = ("interleaved", "half")


def rope_layout_permutation(
    head_dim: int, *, src: str = "interleaved", dst: str = "half", rotary_dim: int | None = None
) -> torch.Tensor:
    """Index ``perm`` (int64, ``(head_dim,)``) with ``features_dst = features_src[..., perm]``.

    Parameters
    ----------
    head_dim
        Features per head (even).
    src, dst
        ``"interleaved"`` or ``"half"``.
    rotary_dim
        Number of rotated features ``r`` (even, ``<= head_dim``); default ``head_dim``.

    Returns
    -------
    Tensor
        int64 ``(head_dim,)``; features past ``rotary_dim`` stay in place.

    Examples
    --------
    >>> import posenc
    >>> posenc.rope_layout_permutation(8).tolist()   # pairs (0, 1), (2, 3), ... to (i, i + 4)
    [0, 2, 4, 6, 1, 3, 5, 7]
    """
    head_dim = check_even("head_dim", head_dim)
    check_choice("src", src, _LAYOUTS)
    check_choice("dst", dst, _LAYOUTS)
    r = head_dim if rotary_dim is None else check_even("rotary_dim", rotary_dim)
    if r > head_dim:
        raise ValueError(f"rotary_dim must be <= head_dim={head_dim}, got {r}")
    rest = torch.arange(r, head_dim)
    if src == dst:
        return torch.arange(head_dim)
    if src == "interleaved":  # slot i <- 2i, slot i + r/2 <- 2i + 1
        return torch.cat((torch.arange(0, r, 2), torch.arange(1, r, 2), rest))
    # half -> interleaved: slot 2i <- i, slot 2i + 1 <- i + r/2
    pairs = torch.stack((torch.arange(r // 2), torch.arange(r // 2, r)), dim=-1)
    return torch.cat((pairs.flatten(), rest))


def interleaved_to_half(
    weight: torch.Tensor, num_heads: int, *, rotary_dim: int | None = None
) -> torch.Tensor:
    """Permute a q/k projection from the interleaved to the half layout.

    Parameters
    ----------
    weight
        Projection weight ``(num_heads * head_dim, hidden)`` (``nn.Linear``
        convention, output rows first) or its bias ``(num_heads * head_dim,)``.
        Convert the query and the key projection, each with its own head count
        (grouped-query attention has fewer key heads).
    num_heads
        Number of heads the rows split into.
    rotary_dim
        Rotated features per head; default the whole head.

    Returns
    -------
    A new tensor of the same shape, dtype and device, rows permuted per head.
    """
    return _permute_rows(weight, num_heads, rotary_dim, "interleaved", "half")


def half_to_interleaved(
    weight: torch.Tensor, num_heads: int, *, rotary_dim: int | None = None
) -> torch.Tensor:
    """Inverse of :func:`interleaved_to_half` (same parameters).

    Parameters
    ----------
    weight, num_heads, rotary_dim
        As in :func:`interleaved_to_half`.

    Returns
    -------
    Tensor
        ``weight`` with the rows of each head back in the interleaved layout.

    Examples
    --------
    >>> import torch, posenc
    >>> w = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))  # 2 heads of 8
    >>> torch.equal(posenc.half_to_interleaved(posenc.interleaved_to_half(w, 2), 2), w)
    True
    """
    return _permute_rows(weight, num_heads, rotary_dim, "half", "interleaved")


def _permute_rows(
    weight: torch.Tensor, num_heads: int, rotary_dim: int | None, src: str, dst: str
) -> torch.Tensor:
    weight = check_tensor("weight", weight, min_dim=1)
    num_heads = check_int("num_heads", num_heads, minimum=1)
    rows = weight.shape[0]
    if rows % num_heads:
        raise ValueError(
            f"weight.shape[0]={rows} must be divisible by num_heads={num_heads} "
            f"(rows are num_heads * head_dim)"
        )
    head_dim = rows // num_heads
    perm = rope_layout_permutation(head_dim, src=src, dst=dst, rotary_dim=rotary_dim)
    heads = weight.reshape(num_heads, head_dim, *weight.shape[1:])
    return heads[:, perm.to(weight.device)].reshape(weight.shape)
