"""RoPE context-extension scalings: position interpolation, NTK, dynamic NTK, YaRN, Llama 3.1.

A RoPE model trained on ``original_max_positions`` tokens has only ever seen
angles ``p * omega_i`` with ``p < original_max_positions``.  Each scaling here
changes the frequencies ``omega_i = base**(-2i/dim)`` so that a longer context
maps onto angles the model already knows, trading resolution for reach in a
different way:

=================  ==========================================================
``linear``         position interpolation (Chen et al., 2023): every
                   frequency divided by ``factor``
``ntk``            NTK-aware base change (bloc97, 2023):
                   ``base * factor**(dim / (dim - 2))``; the highest frequency
                   is untouched, the lowest is divided by ``factor``
``dynamic_ntk``    the same base change with the factor growing with the
                   current length ``seq_len`` past ``original_max_positions``
                   (as in Hugging Face transformers' ``dynamic`` type)
``yarn``           YaRN (Peng et al., 2024): interpolate frequencies whose
                   wavelength is long, keep those that complete many turns
                   within the original context, ramp linearly in between;
                   plus an attention temperature ``0.1 ln(factor) + 1``
``llama3``         Llama 3.1 (Grattafiori et al., 2024): keep wavelengths below
                   ``original / high_freq_factor``, divide those above
                   ``original / low_freq_factor`` by ``factor``, and blend
                   smoothly in between
=================  ==========================================================

Frequencies are computed in float64.  The formulas and constants follow the
papers as the model families implement them (Hugging Face transformers'
``modeling_rope_utils``: YaRN's integer-rounded correction range, Llama 3.1's
band edges).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._checks import check_even, check_float, check_int
from .sinusoidal import sinusoidal_inv_freq  # RoPE reuses the sinusoid's frequency ladder

__all__ = ["RopeScaling"]

_KINDS = ("linear", "ntk", "dynamic_ntk", "yarn", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE frequency scaling; build one with a constructor, not directly.

    Use :meth:`linear`, :meth:`ntk`, :meth:`dynamic_ntk`, :meth:`yarn` or
    :meth:`llama3`, then pass it as ``scaling=`` to :func:`posenc.apply_rope`,
    :func:`posenc.rope_frequencies`, :func:`posenc.rope_cos_sin` or
    :class:`posenc.RotaryEmbedding`.

    Attributes
    ----------
    kind
        One of ``"linear"``, ``"ntk"``, ``"dynamic_ntk"``, ``"yarn"``, ``"llama3"``.
    factor
        Context-extension factor ``s >= 1``.
    original_max_positions
        Training context length (``dynamic_ntk``, ``yarn``, ``llama3``).
    attention_factor
        Multiplier applied to rotated queries *and* keys by
        :func:`posenc.apply_rope` (so scores scale by its square):
        ``0.1 ln(factor) + 1`` for YaRN, 1 otherwise.
    """

    kind: str
    factor: float
    original_max_positions: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self):
        if self.kind not in _KINDS:
            allowed = ", ".join(repr(k) for k in _KINDS)
            raise ValueError(f"kind must be one of {allowed}, got {self.kind!r}")

    # ------------------------------------------------------------------ constructors

    @classmethod
    def linear(cls, factor: float) -> RopeScaling:
        """Position interpolation (Chen et al., 2023): ``omega_i / factor``."""
        return cls("linear", _check_factor(factor))

    @classmethod
    def ntk(cls, factor: float) -> RopeScaling:
        """NTK-aware scaling (bloc97, 2023): base becomes ``base * factor**(dim / (dim - 2))``."""
        return cls("ntk", _check_factor(factor))

    @classmethod
    def dynamic_ntk(cls, factor: float, original_max_positions: int) -> RopeScaling:
        """Dynamic NTK: the NTK base change with a factor that grows with the length.

        For a current length ``L = max(seq_len, original_max_positions)`` the
        base becomes ``base * (factor * L / original - (factor - 1))**(dim / (dim - 2))``,
        so nothing changes up to the training length.
        """
        orig = check_int("original_max_positions", original_max_positions, minimum=1)
        return cls("dynamic_ntk", _check_factor(factor), orig)

    @classmethod
    def yarn(
        cls,
        factor: float,
        original_max_positions: int,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
    ) -> RopeScaling:
        """YaRN (Peng et al., 2024): per-frequency blend of interpolation and extrapolation.

        Frequency ``i`` makes ``original * omega_i / (2 pi)`` turns over the
        training context.  Frequencies with more than ``beta_fast`` turns are
        kept, those with fewer than ``beta_slow`` are divided by ``factor``, and
        a linear ramp over the (integer-rounded) index range in between blends
        the two.  The attention factor is ``0.1 ln(factor) + 1``.
        """
        orig = check_int("original_max_positions", original_max_positions, minimum=1)
        beta_fast = check_float("beta_fast", beta_fast, positive=True)
        beta_slow = check_float("beta_slow", beta_slow, positive=True)
        if beta_fast <= beta_slow:
            raise ValueError(f"beta_fast must be > beta_slow, got {beta_fast} <= {beta_slow}")
        return cls("yarn", _check_factor(factor), orig, beta_fast=beta_fast, beta_slow=beta_slow)

    @classmethod
    def llama3(
        cls,
        factor: float,
        original_max_positions: int,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
    ) -> RopeScaling:
        """Llama 3.1 (Grattafiori et al., 2024), by wavelength ``lambda_i = 2 pi / omega_i``.

        * ``lambda_i < original / high_freq_factor``: unchanged;
        * ``lambda_i > original / low_freq_factor``: divided by ``factor``;
        * in between: ``(1 - a) omega_i / factor + a omega_i`` with
          ``a = (original / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``.
        """
        orig = check_int("original_max_positions", original_max_positions, minimum=1)
        low = check_float("low_freq_factor", low_freq_factor, positive=True)
        high = check_float("high_freq_factor", high_freq_factor, positive=True)
        if high <= low:
            raise ValueError(f"high_freq_factor must be > low_freq_factor, got {high} <= {low}")
        return cls(
            "llama3", _check_factor(factor), orig, low_freq_factor=low, high_freq_factor=high
        )

    # ------------------------------------------------------------------ behaviour

    @property
    def attention_factor(self) -> float:
        """``0.1 ln(factor) + 1`` for YaRN (its attention temperature), 1 otherwise."""
        return 0.1 * math.log(self.factor) + 1.0 if self.kind == "yarn" else 1.0

    def frequencies(self, dim: int, base: float = 10000.0, seq_len: int | None = None):
        """Scaled frequencies, a float64 CPU tensor of shape ``(dim // 2,)``.

        ``seq_len`` (the current context length) matters only to ``dynamic_ntk``;
        ``None`` means "no longer than the training context".
        """
        dim = check_even("dim", dim)
        base = check_float("base", base, positive=True)
        if seq_len is not None:
            seq_len = check_int("seq_len", seq_len, minimum=0)
        s = self.factor
        if self.kind in ("ntk", "dynamic_ntk"):
            if dim < 4:
                raise ValueError(
                    f"dim must be >= 4 for NTK scaling (exponent dim/(dim-2)), got {dim}"
                )
            if self.kind == "dynamic_ntk":
                length = max(seq_len or 0, self.original_max_positions)
                s = s * length / self.original_max_positions - (s - 1)
            return sinusoidal_inv_freq(dim, base=base * s ** (dim / (dim - 2)))
        omega = sinusoidal_inv_freq(dim, base=base)
        if self.kind == "linear":
            return omega / s
        if self.kind == "yarn":
            keep = self._yarn_keep(dim, base)
            return omega * (1 - keep) / s + omega * keep
        return self._llama3(omega)

    def _yarn_keep(self, dim: int, base: float) -> torch.Tensor:
        """Weight of the unscaled frequency: 1 below index ``low``, 0 above ``high``."""

        # index i at which omega_i makes `turns` turns over the original context
        def index_for(turns):
            return (
                dim
                * math.log(self.original_max_positions / (turns * 2 * math.pi))
                / (2 * math.log(base))
            )

        low = max(math.floor(index_for(self.beta_fast)), 0)
        high = min(math.ceil(index_for(self.beta_slow)), dim - 1)
        if low == high:
            high += 0.001  # avoid 0/0 in the ramp, as the reference implementation does
        i = torch.arange(dim // 2, dtype=torch.float64)
        return 1 - ((i - low) / (high - low)).clamp(0, 1)

    def _llama3(self, omega: torch.Tensor) -> torch.Tensor:
        orig = self.original_max_positions
        wavelength = 2 * math.pi / omega
        a = (orig / wavelength - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        blended = (1 - a) * omega / self.factor + a * omega
        out = torch.where(wavelength > orig / self.low_freq_factor, omega / self.factor, omega)
        middle = (wavelength >= orig / self.high_freq_factor) & (
            wavelength <= orig / self.low_freq_factor
        )
        return torch.where(middle, blended, out)

    def __repr__(self) -> str:
        args = [f"factor={self.factor}"]
        if self.original_max_positions is not None:
            args.append(f"original_max_positions={self.original_max_positions}")
        if self.kind == "yarn":
            args += [f"beta_fast={self.beta_fast}", f"beta_slow={self.beta_slow}"]
        if self.kind == "llama3":
            args += [
                f"low_freq_factor={self.low_freq_factor}",
                f"high_freq_factor={self.high_freq_factor}",
            ]
        return f"RopeScaling.{self.kind}({', '.join(args)})"


def _check_factor(factor) -> float:
    return check_float("factor", factor, minimum=1.0)
