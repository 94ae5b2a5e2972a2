"""p-RoPE: RoPE with its slowest frequencies removed (Barbero et al., 2025).

RoPE turns pair ``i`` of a head of size ``d`` by ``theta_i = base**(-2i/d)``
radians per position.  p-RoPE keeps the ``n = floor(p * d / 2)`` fastest pairs
(``i < n``) with exactly those frequencies, the exponent still over the whole
``d``, and gives every other pair the frequency 0: a rotation by angle 0 is the
identity, so those features pass through unchanged at every position and carry
no position at all.  ``p = 1`` is RoPE, ``p = 0`` is NoPE.  The paper reads the
slowest pairs as channels the model uses for content rather than position
(they barely turn within a context), and removing their rotation as keeping
them robust at lengths never seen in training.

This is the frequency rule of Gemma's code and of Hugging Face transformers'
``rope_type="proportional"`` (Gemma 4's full-attention layers, with
``partial_rotary_factor = p``): :meth:`posenc.RopeScaling.proportional`
computes it, and :class:`PartialRotaryEmbedding` is a
:class:`posenc.RotaryEmbedding` with that scaling, so the rotation, its
precision, both pair layouts and the cache are RoPE's own.

``cut="hope"`` places the cut as HoPE (Chen et al., 2025) does instead: a
pair is kept when it completes at least one turn within the training length
``L``, i.e. when its period ``2 pi / theta_i`` is at most ``L``
(``theta_i * L >= 2 pi``), and made position-independent otherwise.  The cut
then depends on ``base`` and ``L``, not on a chosen fraction.

Conventions are :class:`posenc.RotaryEmbedding`'s: counter-clockwise rotation,
``layout="interleaved"`` (default) pairs features ``(2i, 2i + 1)`` and
``"half"`` pairs ``(i, i + d/2)`` (Gemma and transformers use ``"half"``); in
either layout the unrotated features are those of the pairs ``i >= n``, inside
the rotary layout rather than at the end of the head as with ``rotary_dim``.
"""

from __future__ import annotations

import math
from typing import Any

from ._checks import check_choice, check_even, check_float, check_int
from .rope import RotaryEmbedding
from .scaling import RopeScaling
from .scheme import PositionalScheme

__all__ = ["PartialRotaryEmbedding"]

CUTS = ("fraction", "hope")
DEFAULT_P = 0.25  # Gemma 4's full-attention layers (partial_rotary_factor 0.25)


def _hope_pairs(dim: int, base: float, training_length: int) -> int:
    """Number of pairs whose period ``2 pi / theta_i`` is at most ``training_length``."""
    # theta_i decreases with i, so the kept pairs are a prefix: count them in float64
    return sum(1 for i in range(dim // 2) if 2 * math.pi * base ** (2 * i / dim) <= training_length)


def _fraction_for(pairs: int, dim: int) -> float:
    """A ``rotated_fraction`` with ``int(fraction * dim // 2) == pairs`` (transformers' rule)."""
    fraction = pairs / (dim // 2)
    if int(fraction * dim // 2) != pairs:  # pairs / (dim/2) * dim can round just below 2 pairs
        fraction = math.nextafter(fraction, 2.0)
    assert int(fraction * dim // 2) == pairs and fraction <= 1.0
    return fraction


class PartialRotaryEmbedding(RotaryEmbedding):
    """p-RoPE: RoPE on the fastest ``floor(p * dim / 2)`` pairs, the others unrotated.

    A :class:`posenc.RotaryEmbedding` whose scaling is
    :meth:`posenc.RopeScaling.proportional`: pair ``i`` turns by
    ``base**(-2i/dim)`` per position for ``i < n`` and not at all for
    ``i >= n``.  Everything else (call forms, positions, layouts, precision,
    cache, :class:`posenc.KVCache`) is RoPE's; scores depend only on the
    distance between positions.

    Parameters
    ----------
    dim
        Feature size of queries/keys (even); the whole head is in the rotary
        layout.
    p
        Share of the pairs that rotate, in ``[0, 1]``: ``n = floor(p * dim / 2)``
        (computed as transformers does, ``int(p * dim // 2)``).  Default 0.25,
        Gemma 4's value.  Only with ``cut="fraction"``.
    cut
        ``"fraction"`` (default): the cut given by ``p``.  ``"hope"``: HoPE's
        cut, keep exactly the pairs with ``2 pi / theta_i <= training_length``.
    training_length
        The training context length ``L``; required by ``cut="hope"``, refused
        otherwise.
    base
        RoPE's frequency base.
    layout, max_positions, compiled
        As in :class:`posenc.RotaryEmbedding` (``"half"`` for Gemma's and
        transformers' weights).

    Attributes
    ----------
    p
        The share of pairs that rotate: the given ``p``, or for ``cut="hope"``
        the kept pairs over ``dim / 2``.
    rotated_pairs
        ``n``, the number of pairs that rotate (the first ``n`` of the ladder).

    Examples
    --------
    >>> import torch, posenc
    >>> prope = posenc.PartialRotaryEmbedding(8, p=0.5, layout="half")
    >>> prope.rotated_pairs, prope.inv_freq.tolist()     # the 2 fastest of RoPE's 4 kept
    (2, [1.0, 0.1, 0.0, 0.0])
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 1, 2, 10, 8, generator=g, dtype=torch.float64)
    >>> posenc.attention(q, k, v, encoding=prope, causal=True).shape
    torch.Size([1, 2, 10, 8])

    The slow pairs (features 2, 3 and 6, 7 in the half layout) are not rotated:

    >>> qr, kr = prope.rotate(q, k, posenc.CallContext.of(q, k))
    >>> torch.equal(qr[..., [2, 3, 6, 7]], q[..., [2, 3, 6, 7]])
    True

    HoPE's cut keeps the pairs that complete a turn within the training length:

    >>> hope = posenc.PartialRotaryEmbedding(64, cut="hope", training_length=512)
    >>> hope.rotated_pairs                  # 2 pi * 10000**(2i/64) <= 512 for i < 16
    16
    >>> posenc.PartialRotaryEmbedding(64, cut="hope")
    Traceback (most recent call last):
    ...
    ValueError: training_length (the training context length L) is required for cut='hope'...
    """

    reference = "barbero2025round"

    def __init__(
        self,
        dim: int,
        *,
        p: float | None = None,
        cut: str = "fraction",
        training_length: int | None = None,
        base: float = 10000.0,
        layout: str = "interleaved",
        max_positions: int = 2048,
        compiled: bool = False,
    ) -> None:
        dim = check_even("dim", dim)
        base = check_float("base", base, positive=True)
        cut = check_choice("cut", cut, CUTS)
        if cut == "fraction":
            if training_length is not None:
                raise ValueError(
                    f"training_length applies only to cut='hope' (cut='fraction' is set by p), "
                    f"got training_length={training_length!r}"
                )
            p = DEFAULT_P if p is None else check_float("p", p)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"p (the share of pairs that rotate) must be in [0, 1], got {p}")
            pairs, fraction = int(p * dim // 2), p
        else:
            if p is not None:
                raise ValueError(
                    f"p does not apply to cut='hope', whose cut is set by training_length and "
                    f"base; got p={p!r}"
                )
            if training_length is None:
                raise ValueError(
                    "training_length (the training context length L) is required for "
                    "cut='hope': it keeps the pairs whose period 2 pi / theta_i is at most L; "
                    "got None"
                )
            training_length = check_int("training_length", training_length, minimum=1)
            pairs = _hope_pairs(dim, base, training_length)
            fraction = _fraction_for(pairs, dim)
            p = pairs / (dim // 2)
        super().__init__(
            dim,
            base=base,
            layout=layout,
            scaling=RopeScaling.proportional(fraction),
            max_positions=max_positions,
            compiled=compiled,
        )
        self.p = p
        self.cut = cut
        self.training_length = training_length
        self.rotated_pairs = pairs

    @classmethod
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        # p = 0.5 leaves both rotated and still pairs at every even head size >= 4;
        # HoPE with L = 64 keeps the pairs of period <= 64 (base 100 makes that a few)
        options: dict[str, dict[str, Any]] = {
            "": {},
            "half": {"p": 0.5, "layout": "half"},
            "hope": {"cut": "hope", "training_length": 64, "base": 100.0, "layout": "half"},
        }
        return {label: cls.build(num_heads, head_dim, **o) for label, o in options.items()}

    def extra_repr(self) -> str:
        s = f"dim={self.dim}, base={self.base}, layout={self.layout!r}"
        if self.cut == "hope":
            s += f", cut='hope', training_length={self.training_length}"
        else:
            s += f", p={self.p}"
        s += f", rotated_pairs={self.rotated_pairs}"
        if self.compiled:
            s += ", compiled=True"
        return s
