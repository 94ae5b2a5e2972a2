"""Multimodal RoPE (M-RoPE): one position per axis, (t, h, w), as in Qwen2-VL and GLM-V.

A vision-language model gives every token three integer positions: time,
height and width (a text token has all three equal).  M-RoPE keeps the
ordinary 1-D RoPE frequencies ``omega_i = base**(-2i/r)`` over the ``r``
rotated features and chooses, for each rotary pair ``i``, *which* of the
three positions turns it.  ``sections`` (transformers' ``mrope_section``,
summing to ``r // 2``) says how many pairs each axis gets:

* contiguous (Qwen2-VL, Qwen2.5-VL, GLM-4V): pairs ``[0, s_0)`` turn with
  ``t``, the next ``s_1`` with ``h``, the next ``s_2`` with ``w``;
* interleaved (Qwen3-VL, ``mrope_interleaved``): pair ``i`` turns with
  ``h`` if ``i % 3 == 1`` and ``i < 3 s_1``, with ``w`` if ``i % 3 == 2`` and
  ``i < 3 s_2``, with ``t`` otherwise.

Pairs are features by the RoPE layout (:mod:`posenc.rope`): Qwen-VL uses
``"half"`` over the whole head, GLM-4V ``"interleaved"`` over its first
``rotary_dim`` features.  When the three positions of a token are equal the
rotation is 1-D RoPE at that position.

This differs from axial RoPE (:func:`posenc.apply_axial_rope`), where each
axis has its own frequency ladder over ``dim / n`` features: here the axes
share the one ladder and split its pairs.  The grid helper composes:
``posenc.grid_positions(t, h, w).T + offset`` is the ``(3, t*h*w)`` block of
positions of a video's patches in row-major order (Qwen2-VL's
``get_rope_index`` puts a vision block at ``offset`` = the text position
before it).

Positions have shape ``(3, batch, seq)`` (transformers' ``position_ids``) or
``(3, seq)``; each value strictly within ``2**31`` of 0.  Angles are formed
in float64 and rounded once; a :class:`posenc.RopeScaling` changes the
frequencies as in 1-D RoPE (a length-dependent one sees ``max(positions) +
1``, as transformers does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from ._angles import compute_dtype
from ._checks import as_positions, beyond_limit, check_choice, check_even, check_float
from ._rope_kernels import rotate as _rotate
from ._rope_kernels import rotate_functional as _rotate_functional
from ._runtime import has_values, in_transform, tracing
from ._types import Device
from .rope import LAYOUTS, _check_rotary_dim, _check_scaling, _check_x, _frequencies
from .scaling import RopeScaling

__all__ = ["mrope_axes", "mrope_cos_sin", "apply_mrope", "MultimodalRotaryEmbedding"]

ARRANGEMENTS = ("contiguous", "interleaved")


def mrope_axes(sections: Sequence[int], arrangement: str = "contiguous") -> tuple[int, ...]:
    """The axis (0 = t, 1 = h, 2 = w, ...) that turns each rotary pair; ``sum(sections)`` long.

    ``"contiguous"``: section ``j`` of ``sections[j]`` pairs uses axis ``j``.
    ``"interleaved"`` (three sections, Qwen3-VL): pair ``i`` uses axis ``a`` in
    ``(1, 2)`` when ``i % 3 == a`` and ``i < 3 * sections[a]``, else axis 0
    (as transformers does, even where that gives an axis fewer pairs than its
    section; Qwen3-VL's ``(24, 20, 20)`` gives exactly 24, 20, 20).

    Parameters
    ----------
    sections
        Pairs per axis (``mrope_section``), positive ints.
    arrangement
        ``"contiguous"`` or ``"interleaved"``.

    Returns
    -------
    tuple of int
        The axis of each rotary pair.

    Examples
    --------
    >>> import posenc
    >>> posenc.mrope_axes((2, 1, 1)), posenc.mrope_axes((2, 1, 1), "interleaved")
    ((0, 0, 1, 2), (0, 1, 2, 0))
    """
    sections = _check_sections(sections)
    arrangement = check_choice("arrangement", arrangement, ARRANGEMENTS)
    if arrangement == "contiguous":
        return tuple(a for a, size in enumerate(sections) for _ in range(size))
    if len(sections) != 3:
        raise ValueError(
            f"the interleaved arrangement needs 3 sections (t, h, w), got {len(sections)}"
        )
    # transformers' rule taken literally: sections bound the h and w runs; when a run would
    # reach past the last pair (e.g. (2, 3, 3): t h w t h w t h), that axis gets fewer pairs
    return tuple(
        next((a for a in (1, 2) if i % 3 == a and i < 3 * sections[a]), 0)
        for i in range(sum(sections))
    )


def mrope_cos_sin(
    positions: torch.Tensor,
    sections: Sequence[int],
    *,
    base: float = 10000.0,
    scaling: RopeScaling | None = None,
    arrangement: str = "contiguous",
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables ``cos``, ``sin`` of shape ``(*positions.shape[1:], sum(sections))``.

    Entry ``i`` is ``cos(positions[axes[i]] * omega_i)`` (``sin``) with
    ``axes = mrope_axes(sections, arrangement)`` and ``omega`` the 1-D RoPE
    frequencies of ``r = 2 * sum(sections)`` features (after ``scaling``),
    times the scaling's ``attention_factor``.

    Parameters
    ----------
    positions
        Integer positions ``(num_axes, batch, seq)`` or ``(num_axes, seq)``,
        ``num_axes = len(sections)``.
    sections
        Pairs per axis (``mrope_section``), positive ints.
    base, scaling
        As in :func:`posenc.rope_frequencies` for ``r`` features.
    arrangement
        ``"contiguous"`` (Qwen2-VL, GLM-4V) or ``"interleaved"`` (Qwen3-VL).
    dtype, device
        Floating dtype of the tables; device (default: that of ``positions``).

    Returns
    -------
    tuple of Tensor
        ``(cos, sin)``, each ``(*positions.shape[1:], sum(sections))`` in ``dtype``.
    """
    axes = mrope_axes(sections, arrangement)
    base = check_float("base", base, positive=True)
    scaling = _check_scaling(scaling)
    pos = _check_mrope_positions(positions, len(sections), device)
    seq_len: int | torch.Tensor | None = None
    if scaling is not None and scaling.depends_on_length and pos.numel():
        seq_len = pos.max().to(torch.float64) + 1  # transformers: max(position_ids) + 1
        if has_values(pos):
            seq_len = int(seq_len)
    omega = _frequencies(2 * len(axes), base, scaling, seq_len, pos.device)
    chosen = pos.movedim(0, -1)[..., list(axes)]  # (..., seq, pairs): each pair's position
    angle = chosen.to(torch.float64) * omega
    cos, sin = torch.cos(angle), torch.sin(angle)
    if pos.numel() and not has_values(pos):  # unchecked (traced): poison, never silently wrong
        bad = beyond_limit(chosen)
        cos, sin = cos.masked_fill(bad, float("nan")), sin.masked_fill(bad, float("nan"))
    attention = None if scaling is None else scaling.attention_factor  # set once built
    if attention is not None and attention != 1.0:
        cos, sin = cos * attention, sin * attention
    return cos.to(dtype), sin.to(dtype)


def apply_mrope(
    x: torch.Tensor,
    positions: torch.Tensor,
    sections: Sequence[int],
    *,
    base: float = 10000.0,
    layout: str = "half",
    rotary_dim: int | None = None,
    scaling: RopeScaling | None = None,
    arrangement: str = "contiguous",
) -> torch.Tensor:
    """Rotate queries or keys ``(batch, heads, seq, dim)`` by multimodal positions.

    Parameters
    ----------
    x
        Queries or keys, any floating dtype; or ``(seq, dim)`` / ``(heads, seq,
        dim)`` with ``(num_axes, seq)`` positions.
    positions
        ``(num_axes, batch, seq)`` (batch equal to ``x.shape[0]`` or 1) or
        ``(num_axes, seq)``, shared by the heads.
    sections
        Pairs per axis; ``2 * sum(sections)`` must equal ``rotary_dim``.
    base, scaling, arrangement
        As in :func:`mrope_cos_sin`.
    layout
        ``"half"`` (Qwen-VL, the default) or ``"interleaved"`` (GLM-4V).
    rotary_dim
        Rotate the first ``rotary_dim`` features (default ``dim``); the rest
        pass through.

    Returns
    -------
    Tensor like ``x``: equal to transformers' ``apply_multimodal_rotary_pos_emb``
    (Qwen2-VL) / ``apply_rotary_pos_emb`` with the model's recomposed cos/sin.
    """
    x, rotary_dim = _check_x(x, layout, rotary_dim)
    pairs = sum(_check_sections(sections))
    if 2 * pairs != rotary_dim:
        raise ValueError(
            f"sections must sum to rotary_dim // 2 = {rotary_dim // 2} (one axis per rotary "
            f"pair), got {list(sections)} summing to {pairs}"
        )
    pos = _check_mrope_positions(positions, len(sections), x.device)
    seq = x.shape[-2]
    if pos.shape[-1] != seq:
        raise ValueError(
            f"positions must have seq = x.shape[-2] = {seq} as last dimension, "
            f"got {tuple(pos.shape)}"
        )
    work = compute_dtype(x.dtype)
    cos, sin = mrope_cos_sin(
        pos, sections, base=base, scaling=scaling, arrangement=arrangement, dtype=work
    )
    if pos.dim() == 3:  # (batch, seq, pairs) -> one row per batch item, shared by its heads
        if x.dim() < 3 or pos.shape[1] not in (1, x.shape[0]):
            raise ValueError(
                f"positions (num_axes, batch, seq) need batch = x.shape[0] or 1, got "
                f"{tuple(pos.shape)} for x {tuple(x.shape)}"
            )
        cos = cos.view(cos.shape[0], *([1] * (x.dim() - 3)), seq, pairs)
        sin = sin.view(sin.shape[0], *([1] * (x.dim() - 3)), seq, pairs)
    if tracing() or in_transform(x):
        return _rotate_functional(x, cos, sin, layout, rotary_dim)
    return _rotate(x, cos, sin, layout, rotary_dim, None)


class MultimodalRotaryEmbedding(nn.Module):
    """M-RoPE settings in one module: ``module(x, positions)`` is :func:`apply_mrope`.

    :meth:`rotate` ``(q, k, positions)`` rotates queries and keys at the same
    positions.  No table is cached (positions are three-dimensional and
    rarely contiguous); every call evaluates its angles in float64.

    Parameters
    ----------
    dim
        Feature size of queries/keys (even).
    sections, base, layout, rotary_dim, scaling, arrangement
        As in :func:`apply_mrope`.
    """

    def __init__(
        self,
        dim: int,
        sections: Sequence[int],
        *,
        base: float = 10000.0,
        layout: str = "half",
        rotary_dim: int | None = None,
        scaling: RopeScaling | None = None,
        arrangement: str = "contiguous",
    ) -> None:
        super().__init__()
        self.dim = check_even("dim", dim)
        self.rotary_dim = _check_rotary_dim(rotary_dim, self.dim)
        self.sections = _check_sections(sections)
        self.axes = mrope_axes(self.sections, arrangement)
        if 2 * len(self.axes) != self.rotary_dim:
            raise ValueError(
                f"sections must sum to rotary_dim // 2 = {self.rotary_dim // 2}, got "
                f"{list(self.sections)} summing to {len(self.axes)}"
            )
        self.base = check_float("base", base, positive=True)
        self.layout = check_choice("layout", layout, LAYOUTS)
        self.scaling = _check_scaling(scaling)
        self.arrangement = arrangement

    def _settings(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "layout": self.layout,
            "rotary_dim": self.rotary_dim,
            "scaling": self.scaling,
            "arrangement": self.arrangement,
        }

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"x must have last dimension dim={self.dim}, got {x.shape[-1]}")
        return apply_mrope(x, positions, self.sections, **self._settings())

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, k)`` rotated at the same multimodal ``positions``."""
        rq: torch.Tensor = self(q, positions)  # nn.Module.__call__ is untyped
        rk: torch.Tensor = self(k, positions)
        return rq, rk

    def cos_sin(
        self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32, device: Device = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`mrope_cos_sin` with this module's settings."""
        return mrope_cos_sin(
            positions,
            self.sections,
            base=self.base,
            scaling=self.scaling,
            arrangement=self.arrangement,
            dtype=dtype,
            device=device,
        )

    def extra_repr(self) -> str:
        s = f"dim={self.dim}, sections={list(self.sections)}, base={self.base}"
        s += f", layout={self.layout!r}"
        if self.rotary_dim != self.dim:
            s += f", rotary_dim={self.rotary_dim}"
        if self.arrangement != "contiguous":
            s += f", arrangement={self.arrangement!r}"
        if self.scaling is not None:
            s += f", scaling={self.scaling!r}"
        return s


# ---------------------------------------------------------------------- internals


def _check_sections(sections: Iterable[int]) -> tuple[int, ...]:
    if isinstance(sections, (str, bytes)) or not hasattr(sections, "__iter__"):
        raise TypeError(f"sections must be a sequence of positive ints, got {sections!r}")
    out = []
    for i, s in enumerate(sections):
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"sections[{i}] must be a positive int, got {s!r}")
        out.append(s)
    if not out:
        raise ValueError("sections must name at least one axis, e.g. [16, 24, 24]")
    return tuple(out)


def _check_mrope_positions(positions: torch.Tensor, num_axes: int, device: Device) -> torch.Tensor:
    pos = as_positions("positions", positions, device=device)  # bounded by MAX_POSITION
    if pos.dim() not in (2, 3) or pos.shape[0] != num_axes:
        raise ValueError(
            f"positions must have shape (num_axes, batch, seq) or (num_axes, seq) with "
            f"num_axes = len(sections) = {num_axes}, got {tuple(pos.shape)}"
        )
    return pos
