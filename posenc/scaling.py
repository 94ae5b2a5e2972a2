"""RoPE frequency rules: PI, NTK, dynamic NTK, YaRN, Llama 3.1, LongRoPE, proportional.

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
                   plus ``sqrt(1/t) = 0.1 ln(factor) + 1`` multiplying both
                   ``q`` and ``k``, so the logits by its square
``llama3``         Llama 3.1, as Meta's reference ``apply_scaling`` defines it
                   (``meta2024llamamodels``): keep wavelengths below
                   ``original / high_freq_factor``, divide those above
                   ``original / low_freq_factor`` by ``factor``, and in
                   between interpolate the frequency linearly from
                   ``omega_i / factor`` to ``omega_i`` in the weight
                   ``original / lambda_i`` (continuous at both band edges)
``longrope``       LongRoPE (Ding et al., 2024), as in Phi-3: one searched
                   divisor per frequency, ``short_factor`` up to the training
                   length and ``long_factor`` past it, plus an attention
                   factor ``sqrt(1 + ln(factor) / ln(original_max_positions))``
``proportional``   Gemma 4's partial rotation (transformers' ``proportional``):
                   the first ``int(rotated_fraction * dim // 2)`` pairs keep
                   ``base**(-2i/dim)`` with the exponent over the *whole*
                   ``dim``, every other pair gets frequency 0 (cos 1, sin 0:
                   not rotated); all divided by ``factor`` (default 1)
=================  ==========================================================

Each kind is one entry of :data:`ROPE_SCALINGS` (as transformers'
``ROPE_INIT_FUNCTIONS``): a :class:`ScalingKind` holding its frequency function,
written once, its own fields and their checks, its default attention factor
and its flags.  Adding a kind: one function and one entry.

Frequencies are computed in float64.  The formulas and constants follow the
papers as the model families implement them (Hugging Face transformers'
``modeling_rope_utils``: YaRN's integer-rounded correction range, Llama 3.1's
band edges, LongRoPE's switch at the training length);
:func:`posenc.rope_scaling_from_transformers` (also
:meth:`RopeScaling.from_transformers`) reads a transformers configuration: it is
defined here, beside the scalings it builds (table :data:`posenc.ROPE_TYPES`), and
exported by :mod:`posenc.hf`, which imports this module.

``dynamic_ntk`` and ``longrope`` depend on the current length
(:attr:`RopeScaling.depends_on_length`): their frequencies are a function of
``seq_len``, the number of positions in play (transformers uses the largest
position id plus one).  ``seq_len`` may be a 0-d tensor (under
``torch.compile``, where it cannot be read): the same formula then stays a
tensor expression.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from ._checks import check_choice, check_even, check_float, check_int
from .sinusoidal import sinusoidal_inv_freq  # RoPE reuses the sinusoid's frequency ladder

__all__ = ["ROPE_SCALINGS", "RopeScaling", "ScalingKind"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE frequency scaling, validated when it is built.

    Build one with :meth:`linear`, :meth:`ntk`, :meth:`dynamic_ntk`,
    :meth:`yarn`, :meth:`llama3`, :meth:`longrope`, :meth:`proportional` or
    :meth:`from_transformers`, then pass it as ``scaling=`` to
    :func:`posenc.apply_rope`, :func:`posenc.rope_frequencies`,
    :func:`posenc.rope_cos_sin` or :class:`posenc.RotaryEmbedding`.  The
    plain constructor ``RopeScaling(kind, factor, ...)`` checks the same
    things: every field a kind needs is present and in range, and fields that
    belong to another kind are refused.

    Attributes
    ----------
    kind
        One of ``"linear"``, ``"ntk"``, ``"dynamic_ntk"``, ``"yarn"``,
        ``"llama3"``, ``"longrope"``, ``"proportional"``.
    factor
        Context-extension factor ``s >= 1`` (for ``longrope`` it only sets the
        default attention factor; Phi-3 uses ``max / original`` positions).
    original_max_positions
        Training context length; required by ``dynamic_ntk``, ``yarn``,
        ``llama3`` and ``longrope``, refused by the others.
    beta_fast, beta_slow, truncate
        YaRN's turn counts bounding the ramp (default 32 and 1) and whether
        the ramp's index range is rounded outwards to integers (default True).
    low_freq_factor, high_freq_factor
        Llama 3.1's band edges (default 1 and 4).
    short_factor, long_factor
        LongRoPE's per-frequency divisors, tuples of ``dim // 2`` positive
        floats.
    rotated_fraction
        ``proportional``'s share of the features that rotate, in ``[0, 1]``
        (default 1: plain RoPE divided by ``factor``).
    attention_factor
        Multiplier applied to rotated queries *and* keys by
        :func:`posenc.apply_rope` (so scores scale by its square).  Only YaRN
        and LongRoPE have one: by default ``0.1 ln(factor) + 1`` for YaRN and
        ``sqrt(1 + ln(factor) / ln(original_max_positions))`` for LongRoPE;
        1 for every other kind.

    Examples
    --------
    >>> import posenc
    >>> pi = posenc.RopeScaling.linear(4.0)
    >>> pi
    RopeScaling.linear(factor=4.0)
    >>> pi.frequencies(8).tolist()          # 1, 0.1, 0.01, 0.001 (base 10000), divided by 4
    [0.25, 0.025, 0.0025, 0.00025]
    >>> rope = posenc.RotaryEmbedding(64, scaling=pi)
    >>> posenc.RopeScaling("ntk", 4.0) == posenc.RopeScaling.ntk(4.0)
    True
    >>> posenc.RopeScaling("linear", 4.0, original_max_positions=4096)
    Traceback (most recent call last):
    ...
    ValueError: original_max_positions does not apply to kind 'linear' (only to ...), got 4096
    """

    kind: str
    factor: float
    original_max_positions: int | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    truncate: bool | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    rotated_fraction: float | None = None
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:  # frozen: fields are normalised once, here
            object.__setattr__(self, name, value)

        if not isinstance(self.kind, str):
            raise TypeError(f"kind must be a string, got {type(self.kind).__name__}")
        kind = check_choice("kind", self.kind, ROPE_SCALINGS)
        spec = ROPE_SCALINGS[kind]
        put("factor", check_float("factor", self.factor, minimum=1.0))

        if spec.needs_original:
            if self.original_max_positions is None:
                raise ValueError(
                    f"original_max_positions (the training context length) is required "
                    f"for kind {kind!r}, got None"
                )
            put(
                "original_max_positions",
                check_int("original_max_positions", self.original_max_positions, minimum=1),
            )
        elif self.original_max_positions is not None:
            needing = [k for k, v in ROPE_SCALINGS.items() if v.needs_original]
            raise ValueError(
                f"original_max_positions does not apply to kind {kind!r} (only to "
                f"{', '.join(repr(k) for k in needing)}), got {self.original_max_positions!r}"
            )

        for other, other_spec in ROPE_SCALINGS.items():
            for name in other_spec.fields:
                if getattr(self, name) is not None and kind != other:
                    raise ValueError(
                        f"{name} applies only to kind {other!r}, not {kind!r}; "
                        f"got {name}={getattr(self, name)!r}"
                    )
        if spec.check is not None:
            spec.check(self, put)

        if self.attention_factor is None:
            put("attention_factor", 1.0 if spec.attention is None else spec.attention(self))
        elif spec.attention is None:
            having = [k for k, v in ROPE_SCALINGS.items() if v.attention is not None]
            raise ValueError(
                f"attention_factor applies only to kinds {' and '.join(map(repr, having))}, "
                f"not {kind!r}; got attention_factor={self.attention_factor!r}"
            )
        else:
            put(
                "attention_factor",
                check_float("attention_factor", self.attention_factor, positive=True),
            )

    # ------------------------------------------------------------------ constructors

    @classmethod
    def linear(cls, factor: float) -> RopeScaling:
        """Position interpolation (Chen et al., 2023): ``omega_i / factor``.

        Parameters
        ----------
        factor
            Context-extension factor ``s >= 1``: every frequency is divided by it.

        Returns
        -------
        RopeScaling

        Examples
        --------
        >>> import posenc
        >>> posenc.RopeScaling.linear(2.0).frequencies(4).tolist()   # 1 and 0.01, halved
        [0.5, 0.005]
        """
        return cls("linear", factor)

    @classmethod
    def ntk(cls, factor: float) -> RopeScaling:
        """NTK-aware scaling (bloc97, 2023): base becomes ``base * factor**(dim / (dim - 2))``.

        Parameters
        ----------
        factor
            Context-extension factor ``s >= 1``: the slowest frequency is
            divided by it, the fastest kept.

        Returns
        -------
        RopeScaling

        Examples
        --------
        >>> import posenc
        >>> ntk = posenc.RopeScaling.ntk(4.0)
        >>> [round(f, 6) for f in ntk.frequencies(8).tolist()]   # the fastest kept, the slowest / 4
        [1.0, 0.062996, 0.003969, 0.00025]
        """
        return cls("ntk", factor)

    @classmethod
    def dynamic_ntk(cls, factor: float, original_max_positions: int) -> RopeScaling:
        """Dynamic NTK: the NTK base change with a factor that grows with the length.

        For a current length ``L = max(seq_len, original_max_positions)`` the
        base becomes ``base * (factor * L / original - (factor - 1))**(dim / (dim - 2))``,
        so nothing changes up to the training length.

        Examples
        --------
        >>> import posenc
        >>> dyn = posenc.RopeScaling.dynamic_ntk(2.0, original_max_positions=4096)
        >>> dyn.depends_on_length
        True
        >>> dyn.frequencies(8, seq_len=4096).tolist()     # unchanged up to the training length
        [1.0, 0.1, 0.01, 0.001]
        >>> [round(f, 6) for f in dyn.frequencies(8, seq_len=8192).tolist()]
        [1.0, 0.069336, 0.004807, 0.000333]
        """
        return cls("dynamic_ntk", factor, original_max_positions)

    @classmethod
    def yarn(
        cls,
        factor: float,
        original_max_positions: int,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        *,
        truncate: bool = True,
        attention_factor: float | None = None,
        mscale: float | None = None,
        mscale_all_dim: float | None = None,
    ) -> RopeScaling:
        """YaRN (Peng et al., 2024): per-frequency blend of interpolation and extrapolation.

        Frequency ``i`` makes ``original * omega_i / (2 pi)`` turns over the
        training context.  Frequencies with more than ``beta_fast`` turns are
        kept, those with fewer than ``beta_slow`` are divided by ``factor``, and
        a linear ramp over the index range in between blends the two.  With
        ``truncate=True`` (the default, as in the paper's code) that range is
        rounded outwards to integers; gpt-oss uses ``truncate=False``.

        The attention factor is ``0.1 ln(factor) + 1`` unless given.  DeepSeek
        models give ``mscale`` and ``mscale_all_dim`` instead (both together):
        it is then ``m(mscale) / m(mscale_all_dim)`` with
        ``m(a) = 0.1 a ln(factor) + 1``, as in transformers.  (DeepSeek's
        attention additionally multiplies its softmax scale by
        ``m(mscale_all_dim)**2``; that belongs to the model, not to RoPE.)

        Examples
        --------
        >>> import posenc
        >>> yarn = posenc.RopeScaling.yarn(4.0, original_max_positions=4096)
        >>> yarn
        RopeScaling.yarn(factor=4.0, original_max_positions=4096, beta_fast=32.0, beta_slow=1.0,
                         attention_factor=1.1386...)
        >>> round(yarn.attention_factor, 6)                # 0.1 ln(4) + 1
        1.138629
        >>> f, plain = yarn.frequencies(128), posenc.rope_frequencies(128)
        >>> bool(f[0] == plain[0]), bool(f[-1] == plain[-1] / 4)   # fast pairs kept, slow ones / 4
        (True, True)
        """
        if (mscale is None) != (mscale_all_dim is None):
            given = "mscale" if mscale is not None else "mscale_all_dim"
            raise ValueError(
                f"mscale and mscale_all_dim set YaRN's attention factor only together "
                f"(transformers ignores one alone); got only {given}. Give both, or "
                f"attention_factor"
            )
        if mscale is not None:
            if attention_factor is not None:
                raise ValueError(
                    "give attention_factor or mscale/mscale_all_dim, not both "
                    f"(got attention_factor={attention_factor!r}, mscale={mscale!r}, "
                    f"mscale_all_dim={mscale_all_dim!r})"
                )
            s = check_float("factor", factor, minimum=1.0)
            m = check_float("mscale", mscale, positive=True)
            m_all = check_float("mscale_all_dim", mscale_all_dim, positive=True)
            attention_factor = _yarn_mscale(s, m) / _yarn_mscale(s, m_all)
        return cls(
            "yarn",
            factor,
            original_max_positions,
            beta_fast=beta_fast,
            beta_slow=beta_slow,
            truncate=truncate,
            attention_factor=attention_factor,
        )

    @classmethod
    def llama3(
        cls,
        factor: float,
        original_max_positions: int,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
    ) -> RopeScaling:
        """Llama 3.1, by wavelength ``lambda_i = 2 pi / omega_i``.

        The rule is Meta's reference ``apply_scaling`` (``meta2024llamamodels``),
        which transformers copies:

        * ``lambda_i < original / high_freq_factor``: unchanged;
        * ``lambda_i > original / low_freq_factor``: divided by ``factor``;
        * in between: ``(1 - a) omega_i / factor + a omega_i`` with
          ``a = (original / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``,
          linear interpolation between ``omega_i / factor`` and ``omega_i``
          in a weight ``a`` that is linear in ``1 / lambda_i``.

        Examples
        --------
        >>> import posenc
        >>> llama = posenc.RopeScaling.llama3(8.0, original_max_positions=8192)   # Llama 3.1
        >>> f = llama.frequencies(128, base=500000.0)
        >>> plain = posenc.rope_frequencies(128, base=500000.0)
        >>> bool(f[0] == plain[0]), bool(f[-1] == plain[-1] / 8)
        (True, True)
        >>> int(((f != plain) & (f != plain / 8)).sum())   # pairs blended in the band between
        6
        """
        return cls(
            "llama3",
            factor,
            original_max_positions,
            low_freq_factor=low_freq_factor,
            high_freq_factor=high_freq_factor,
        )

    @classmethod
    def longrope(
        cls,
        short_factor: Sequence[float] | torch.Tensor,
        long_factor: Sequence[float] | torch.Tensor,
        original_max_positions: int,
        factor: float,
        *,
        attention_factor: float | None = None,
    ) -> RopeScaling:
        """LongRoPE (Ding et al., 2024) as in Phi-3: ``omega_i`` divided per frequency.

        Frequency ``i`` becomes ``omega_i / short_factor[i]`` while
        ``seq_len <= original_max_positions`` (and when ``seq_len`` is not
        given), ``omega_i / long_factor[i]`` past it; each list holds
        ``dim // 2`` positive divisors found by search.  ``factor`` (``max /
        original`` positions for Phi-3, 32 for Phi-3.5-mini) only sets the
        default attention factor
        ``sqrt(1 + ln(factor) / ln(original_max_positions))``.

        Examples
        --------
        >>> import posenc
        >>> lr = posenc.RopeScaling.longrope([1.0, 2.0], [1.0, 4.0], original_max_positions=4096,
        ...                                  factor=32.0)
        >>> lr.frequencies(4).tolist()                    # short_factor, up to 4096 positions
        [1.0, 0.005]
        >>> lr.frequencies(4, seq_len=8192).tolist()      # long_factor past them
        [1.0, 0.0025]
        >>> round(lr.attention_factor, 6)                 # sqrt(1 + ln 32 / ln 4096)
        1.190238
        """
        return cls(
            "longrope",
            factor,
            original_max_positions,
            # any sequence of numbers (a list, a tensor): __post_init__ stores it as a tuple
            short_factor=short_factor,  # type: ignore[arg-type]
            long_factor=long_factor,  # type: ignore[arg-type]
            attention_factor=attention_factor,
        )

    @classmethod
    def proportional(cls, rotated_fraction: float, factor: float = 1.0) -> RopeScaling:
        """Gemma 4's partial rotation (transformers' ``proportional`` type).

        With ``n = int(rotated_fraction * dim // 2)``, pair ``i < n`` has
        frequency ``base**(-2i/dim) / factor`` (the exponent divides by the
        whole ``dim``, not by ``2n``) and every pair ``i >= n`` has frequency 0,
        so it is not rotated.  Unlike ``rotary_dim`` (GPT-NeoX), the unrotated
        pairs sit inside the rotary layout: in the ``"half"`` layout they are
        features ``[n, dim/2)`` and ``[dim/2 + n, dim)``.  Use it on the whole
        head: ``RotaryEmbedding(head_dim, layout="half", scaling=...)``.

        Examples
        --------
        >>> import posenc
        >>> posenc.RopeScaling.proportional(0.5).frequencies(8).tolist()   # half the pairs rotate
        [1.0, 0.1, 0.0, 0.0]
        """
        return cls("proportional", factor, rotated_fraction=rotated_fraction)

    @classmethod
    def from_transformers(
        cls,
        rope_parameters: Mapping[str, Any] | None,
        *,
        max_position_embeddings: int | None = None,
        original_max_position_embeddings: int | None = None,
    ) -> RopeScaling | None:
        """The scaling of a transformers ``rope_parameters`` (or ``rope_scaling``) dict.

        The same as :func:`posenc.rope_scaling_from_transformers` (defined at
        the end of this module, exported by :mod:`posenc.hf` with the reader of
        whole RoPE modules, :func:`posenc.rope_from_transformers`).

        Parameters
        ----------
        rope_parameters
            The dict, or ``None``.
        max_position_embeddings, original_max_position_embeddings
            As in :func:`posenc.rope_scaling_from_transformers`.

        Returns
        -------
        RopeScaling or None
            ``None`` for plain RoPE (``rope_type`` ``"default"``).

        Examples
        --------
        >>> import posenc
        >>> posenc.RopeScaling.from_transformers(
        ...     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        ...      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
        RopeScaling.llama3(factor=8.0, original_max_positions=8192, low_freq_factor=1.0,
                           high_freq_factor=4.0)
        >>> posenc.RopeScaling.from_transformers({"rope_type": "default"}) is None
        True
        """
        return rope_scaling_from_transformers(
            rope_parameters,
            max_position_embeddings=max_position_embeddings,
            original_max_position_embeddings=original_max_position_embeddings,
        )

    # ------------------------------------------------------------------ behaviour

    @property
    def depends_on_length(self) -> bool:
        """True when the frequencies depend on ``seq_len`` (``dynamic_ntk``, ``longrope``)."""
        return ROPE_SCALINGS[self.kind].depends_on_length

    def frequencies(
        self, dim: int, base: float = 10000.0, seq_len: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Scaled frequencies, a float64 tensor of shape ``(dim // 2,)``.

        ``seq_len`` (the current context length) matters only when
        :attr:`depends_on_length`; ``None`` means "no longer than the training
        context".  An int gives a CPU tensor; a 0-d tensor (traced code) keeps
        the length-dependent part a tensor expression on its device.
        """
        dim = check_even("dim", dim)
        base = check_float("base", base, positive=True)
        device = None
        if isinstance(seq_len, torch.Tensor):
            device = seq_len.device
            seq_len = seq_len.to(torch.float64)
        elif seq_len is not None:
            seq_len = check_int("seq_len", seq_len, minimum=0)
        return ROPE_SCALINGS[self.kind].frequencies(self, dim, base, seq_len, device)

    def __repr__(self) -> str:
        args = [f"factor={self.factor}"]
        if self.original_max_positions is not None:
            args.append(f"original_max_positions={self.original_max_positions}")
        if self.kind == "yarn":
            args += [f"beta_fast={self.beta_fast}", f"beta_slow={self.beta_slow}"]
            if not self.truncate:
                args.append("truncate=False")
        if self.kind == "llama3":
            args += [
                f"low_freq_factor={self.low_freq_factor}",
                f"high_freq_factor={self.high_freq_factor}",
            ]
        if self.kind == "longrope":
            args = [
                f"short_factor={_brief(_filled(self.short_factor))}",
                f"long_factor={_brief(_filled(self.long_factor))}",
                *args[::-1],
            ]
        if self.kind == "proportional":
            args = [f"rotated_fraction={self.rotated_fraction}", *args]
        if ROPE_SCALINGS[self.kind].attention is not None:
            args.append(f"attention_factor={self.attention_factor}")
        return f"RopeScaling.{self.kind}({', '.join(args)})"


# ---------------------------------------------------------------------- the kinds

# The context length a frequency function receives, and a kind check's field setter.
_Length = int | torch.Tensor | None
_Put = Callable[[str, object], None]

# Each frequency function takes (scaling, dim, base, seq_len, device) and returns float64
# (dim // 2,) frequencies; seq_len is None, an int, or a float64 0-d tensor (traced).


def _ladder(
    dim: int, base: float | torch.Tensor, device: torch.device | None = None
) -> torch.Tensor:
    """``base ** (-2i / dim)``: the sinusoid's frequencies, for a float or 0-d tensor base."""
    exponent = torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim
    return base**-exponent


def _linear(
    sc: RopeScaling, dim: int, base: float, seq_len: _Length, device: torch.device | None
) -> torch.Tensor:
    return sinusoidal_inv_freq(dim, base=base, device=device) / sc.factor


def _ntk_base(dim: int, base: float, factor: float | torch.Tensor) -> float | torch.Tensor:
    """NTK's base change ``base * factor**(dim / (dim - 2))``."""
    if dim < 4:
        raise ValueError(f"dim must be >= 4 for NTK scaling (exponent dim/(dim-2)), got {dim}")
    return base * factor ** (dim / (dim - 2))


def _ntk(
    sc: RopeScaling, dim: int, base: float, seq_len: _Length, device: torch.device | None
) -> torch.Tensor:
    return _ladder(dim, _ntk_base(dim, base, sc.factor), device)


def _dynamic_ntk(
    sc: RopeScaling, dim: int, base: float, seq_len: _Length, device: torch.device | None
) -> torch.Tensor:
    # the factor grows with L = max(seq_len, original): factor * L / original - (factor - 1)
    orig = _filled(sc.original_max_positions)
    length: int | torch.Tensor
    if seq_len is None:
        length = orig
    elif isinstance(seq_len, torch.Tensor):
        length = torch.clamp(seq_len, min=orig)
    else:
        length = max(seq_len, orig)
    factor = sc.factor * length / orig - (sc.factor - 1)
    return _ladder(dim, _ntk_base(dim, base, factor), device)


def _yarn(
    sc: RopeScaling, dim: int, base: float, seq_len: _Length, device: torch.device | None
) -> torch.Tensor:
    omega = sinusoidal_inv_freq(dim, base=base, device=device)

    # index i at which omega_i makes `turns` turns over the original context
    orig = _filled(sc.original_max_positions)

    def index_for(turns: float) -> float:
        return dim * math.log(orig / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = index_for(_filled(sc.beta_fast)), index_for(_filled(sc.beta_slow))
    if sc.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid 0/0 in the ramp, as the reference implementation does
    i = torch.arange(dim // 2, dtype=torch.float64, device=device)
    keep = 1 - ((i - low) / (high - low)).clamp(0, 1)  # weight of the unscaled frequency
    return omega * (1 - keep) / sc.factor + omega * keep


def _llama3(
    sc: RopeScaling, dim: int, base: float, seq_len: _Length, device: torch.device | None
) -> torch.Tensor:
    omega = sinusoidal_inv_freq(dim, base=base, device=device)
    orig = _filled(sc.original_max_positions)
    low, high = _filled(sc.low_freq_factor), _filled(sc.high_freq_factor)
    wavelength = 2 * math.pi / omega
    a = (orig / wavelength - low) / (high - low)
    blended = (1 - a) * omega / sc.factor + a * omega
    out = torch.where(wavelength > orig / low, omega / sc.factor, omega)
    middle = (wavelength >= orig / high) & (wavelength <= orig / low)
    return torch.where(middle, blended, out)


def _longrope(
    sc: RopeScaling, dim: int, base: float, seq_len: _Length, device: torch.device | None
) -> torch.Tensor:
    short_factor, long_factor = _filled(sc.short_factor), _filled(sc.long_factor)
    if len(short_factor) != dim // 2:
        raise ValueError(
            f"short_factor and long_factor have {len(short_factor)} entries, "
            f"one per frequency, so dim must be {2 * len(short_factor)}, got {dim}"
        )
    omega = sinusoidal_inv_freq(dim, base=base, device=device)
    short = torch.tensor(short_factor, dtype=torch.float64, device=device)
    long = torch.tensor(long_factor, dtype=torch.float64, device=device)
    orig = _filled(sc.original_max_positions)
    beyond = seq_len is not None and seq_len > orig  # bool or 0-d tensor
    return omega / torch.where(torch.as_tensor(beyond, device=device), long, short)


def _proportional(
    sc: RopeScaling, dim: int, base: float, seq_len: _Length, device: torch.device | None
) -> torch.Tensor:
    # transformers: rope_angles = int(partial_rotary_factor * head_dim // 2), exponent over head_dim
    rotated = int(_filled(sc.rotated_fraction) * dim // 2)
    omega = sinusoidal_inv_freq(dim, base=base, device=device)
    keep = torch.arange(dim // 2, device=device) < rotated
    return torch.where(keep, omega, torch.zeros_like(omega)) / sc.factor


def _check_yarn(sc: RopeScaling, put: _Put) -> None:
    fast = check_float("beta_fast", _default(sc.beta_fast, 32.0), positive=True)
    slow = check_float("beta_slow", _default(sc.beta_slow, 1.0), positive=True)
    if fast <= slow:
        raise ValueError(f"beta_fast must be > beta_slow, got {fast} <= {slow}")
    truncate = _default(sc.truncate, True)
    if not isinstance(truncate, bool):
        raise TypeError(f"truncate must be a bool, got {type(truncate).__name__}")
    put("beta_fast", fast)
    put("beta_slow", slow)
    put("truncate", truncate)


def _check_llama3(sc: RopeScaling, put: _Put) -> None:
    low = check_float("low_freq_factor", _default(sc.low_freq_factor, 1.0), positive=True)
    high = check_float("high_freq_factor", _default(sc.high_freq_factor, 4.0), positive=True)
    if high <= low:
        raise ValueError(f"high_freq_factor must be > low_freq_factor, got {high} <= {low}")
    put("low_freq_factor", low)
    put("high_freq_factor", high)


def _check_longrope(sc: RopeScaling, put: _Put) -> None:
    short = _check_factor_list("short_factor", sc.short_factor)
    long = _check_factor_list("long_factor", sc.long_factor)
    if len(short) != len(long):
        raise ValueError(
            f"short_factor and long_factor must have the same length (dim // 2), "
            f"got {len(short)} and {len(long)}"
        )
    put("short_factor", short)
    put("long_factor", long)


def _check_proportional(sc: RopeScaling, put: _Put) -> None:
    fraction = check_float("rotated_fraction", _default(sc.rotated_fraction, 1.0))
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"rotated_fraction must be in [0, 1], got {fraction}")
    put("rotated_fraction", fraction)


def _longrope_attention(sc: RopeScaling) -> float:
    """``sqrt(1 + ln(factor) / ln(original_max_positions))``, 1 for ``factor <= 1``."""
    if sc.factor <= 1.0:
        return 1.0
    orig = _filled(sc.original_max_positions)
    if orig < 2:
        raise ValueError(
            "original_max_positions must be >= 2 for LongRoPE's default attention factor "
            f"sqrt(1 + ln(factor) / ln(original_max_positions)), got "
            f"{orig}; give attention_factor explicitly"
        )
    return math.sqrt(1.0 + math.log(sc.factor) / math.log(orig))


@dataclass(frozen=True)
class ScalingKind:
    """One kind of RoPE scaling: an entry of :data:`ROPE_SCALINGS`.

    Attributes
    ----------
    frequencies
        ``f(scaling, dim, base, seq_len, device) -> (dim // 2,)`` float64
        frequencies; ``seq_len`` is ``None``, an int or a float64 0-d tensor.
    fields
        The :class:`RopeScaling` fields that belong to this kind only.
    check
        ``check(scaling, put)``: validate those fields and fill their defaults
        (``put(name, value)`` sets a field of the frozen scaling).
    attention
        ``attention(scaling) -> float``: the default attention factor, or
        ``None`` when the kind has none (its factor is 1 and cannot be set).
    needs_original
        Whether ``original_max_positions`` is required (else refused).
    depends_on_length
        Whether the frequencies depend on ``seq_len``.
    """

    frequencies: Callable[
        [RopeScaling, int, float, int | torch.Tensor | None, torch.device | None], torch.Tensor
    ]
    fields: tuple[str, ...] = ()
    check: Callable[[RopeScaling, Callable[[str, object], None]], None] | None = None
    attention: Callable[[RopeScaling], float] | None = None
    needs_original: bool = False
    depends_on_length: bool = False


#: kind -> :class:`ScalingKind`, in the order of the module docstring's table.
ROPE_SCALINGS: dict[str, ScalingKind] = {
    "linear": ScalingKind(_linear),
    "ntk": ScalingKind(_ntk),
    "dynamic_ntk": ScalingKind(_dynamic_ntk, needs_original=True, depends_on_length=True),
    "yarn": ScalingKind(
        _yarn,
        ("beta_fast", "beta_slow", "truncate"),
        _check_yarn,
        attention=lambda sc: _yarn_mscale(sc.factor),
        needs_original=True,
    ),  # fmt: skip
    "llama3": ScalingKind(
        _llama3, ("low_freq_factor", "high_freq_factor"), _check_llama3, needs_original=True
    ),
    "longrope": ScalingKind(
        _longrope,
        ("short_factor", "long_factor"),
        _check_longrope,
        attention=_longrope_attention,
        needs_original=True,
        depends_on_length=True,
    ),  # fmt: skip
    "proportional": ScalingKind(_proportional, ("rotated_fraction",), _check_proportional),
}


def _default(value: _T | None, default: _T) -> _T:
    return default if value is None else value


def _filled(value: _T | None) -> _T:
    """A field that the constructor has checked and filled for this kind (never ``None``)."""
    assert value is not None, "a field required by the scaling's kind is None"
    return value


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's ``sqrt(1/t) = 0.1 mscale ln(factor) + 1`` on q and k (1 when ``factor <= 1``)."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def _check_factor_list(name: str, values: Any) -> tuple[float, ...]:
    if values is None:
        raise ValueError(f"{name} is required for kind 'longrope', got None")
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of positive numbers, got {values!r}")
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{name}[{i}] must be a real number, got {type(v).__name__} {v!r}")
        out.append(check_float(f"{name}[{i}]", v, positive=True))
    if not out:
        raise ValueError(f"{name} must not be empty")
    return tuple(out)


def _brief(values: tuple[float, ...]) -> str:
    if len(values) <= 4:
        return repr(values)
    return f"({values[0]}, {values[1]}, ..., {values[-1]})[{len(values)} values]"


# ---------------------------------------------------------------------- transformers
# The reader of one flat transformers ``rope_parameters`` dict.  It lives here, not in
# posenc.hf (which re-exports it and reads whole RoPE modules), so that
# RopeScaling.from_transformers needs no import of a module that imports this one.

# keys every type accepts besides its own: they belong to RoPE, not to the scaling (checked
# here, used by rope_from_transformers)
COMMON_KEYS = (
    "rope_type", "type", "rope_theta", "partial_rotary_factor", "mrope_section",
    "mrope_interleaved",
)  # fmt: skip
ALIASES = {"su": "longrope"}  # Phi-3's first name for LongRoPE


@dataclass(frozen=True)
class _HFConfig:
    """The dict being read, and the lengths given next to it."""

    name: str
    params: Mapping[str, Any]
    max_position_embeddings: int | None
    original_max_position_embeddings: int | None

    def required(self, key: str) -> Any:
        if self.params.get(key) is None:
            raise ValueError(f"rope_parameters[{key!r}] is required for rope_type {self.name!r}")
        return self.params[key]

    def get(self, key: str, default: Any = None) -> Any:
        value = self.params.get(key)
        return default if value is None else value

    def original(self) -> int:
        """The training length: in the dict, next to it, or ``max_position_embeddings``."""
        given = self.params.get("original_max_position_embeddings")
        outside = self.original_max_position_embeddings
        if given is not None and outside is not None and given != outside:
            raise ValueError(
                f"rope_parameters['original_max_position_embeddings']={given!r} and "
                f"original_max_position_embeddings={outside!r} disagree"
            )
        candidates = (given, outside, self.max_position_embeddings)
        length = next((v for v in candidates if v is not None), None)
        if length is None:
            raise ValueError(
                f"rope_type {self.name!r} needs the training length: "
                f"rope_parameters['original_max_position_embeddings'], or the keyword "
                f"original_max_position_embeddings or max_position_embeddings"
            )
        return check_int("original_max_position_embeddings", length, minimum=1)


def _read_dynamic(c: _HFConfig) -> RopeScaling:
    if c.max_position_embeddings is None:
        raise ValueError(
            "max_position_embeddings is required for rope_type 'dynamic': transformers "
            "grows the factor past it"
        )
    return RopeScaling.dynamic_ntk(c.required("factor"), c.max_position_embeddings)


def _read_yarn(c: _HFConfig) -> RopeScaling:
    return RopeScaling.yarn(
        c.required("factor"),
        c.original(),
        c.get("beta_fast", 32.0),
        c.get("beta_slow", 1.0),
        truncate=c.get("truncate", True),
        attention_factor=c.get("attention_factor"),
        mscale=c.get("mscale"),
        mscale_all_dim=c.get("mscale_all_dim"),
    )


def _read_llama3(c: _HFConfig) -> RopeScaling:
    return RopeScaling.llama3(
        c.required("factor"),
        c.original(),
        c.required("low_freq_factor"),
        c.required("high_freq_factor"),
    )


def _read_longrope(c: _HFConfig) -> RopeScaling:
    short, long = c.required("short_factor"), c.required("long_factor")
    orig = c.original()
    factor = c.get("factor")
    if factor is None:  # Phi-3: factor = max / original positions
        if c.max_position_embeddings is None:
            raise ValueError(
                "rope_type 'longrope' needs rope_parameters['factor'] or "
                "max_position_embeddings (factor = max_position_embeddings / "
                "original_max_position_embeddings)"
            )
        factor = c.max_position_embeddings / orig
        if factor < 1.0:
            raise ValueError(
                f"max_position_embeddings / original_max_position_embeddings must be >= 1 "
                f"for longrope, got {c.max_position_embeddings} / {orig}"
            )
    return RopeScaling.longrope(
        short, long, orig, factor, attention_factor=c.get("attention_factor")
    )


def _read_proportional(c: _HFConfig) -> RopeScaling:
    # transformers reads partial_rotary_factor here as the share of pairs that keep a frequency
    return RopeScaling.proportional(c.get("partial_rotary_factor", 1.0), c.get("factor", 1.0))


@dataclass(frozen=True)
class RopeType:
    """One transformers ``rope_type``: the keys it reads and how posenc reproduces it."""

    keys: tuple[str, ...]
    read: Callable[[_HFConfig], RopeScaling | None]


#: transformers' ``rope_type`` -> the keys it reads (modeling_rope_utils, transformers 5.x)
#: and the reader that builds the scaling.
ROPE_TYPES: dict[str, RopeType] = {
    "default": RopeType((), lambda c: None),
    "linear": RopeType(("factor",), lambda c: RopeScaling.linear(c.required("factor"))),
    "dynamic": RopeType(("factor",), _read_dynamic),
    "yarn": RopeType(
        (
            "factor",
            "original_max_position_embeddings",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ),
        _read_yarn,
    ),  # fmt: skip
    "llama3": RopeType(
        ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
        _read_llama3,
    ),
    "longrope": RopeType(
        (
            "short_factor",
            "long_factor",
            "original_max_position_embeddings",
            "factor",
            "attention_factor",
        ),
        _read_longrope,
    ),  # fmt: skip
    "proportional": RopeType(("factor",), _read_proportional),
}


def rope_scaling_from_transformers(
    rope_parameters: Mapping[str, Any] | None,
    *,
    max_position_embeddings: int | None = None,
    original_max_position_embeddings: int | None = None,
) -> RopeScaling | None:
    """Read a Hugging Face transformers ``rope_scaling`` or ``rope_parameters`` dict.

    Returns ``None`` for ``rope_type`` ``"default"`` (or ``None``/``{}``),
    which means plain RoPE.  The dict's keys are transformers' own:
    ``rope_type`` (or the older ``type``; ``"su"`` is read as ``"longrope"``),
    ``factor``, ``original_max_position_embeddings``, ``attention_factor``,
    ``beta_fast``, ``beta_slow``, ``mscale``, ``mscale_all_dim``, ``truncate``
    (yarn), ``low_freq_factor``, ``high_freq_factor`` (llama3),
    ``short_factor``, ``long_factor`` (longrope); ``partial_rotary_factor``
    and ``factor`` (proportional); see :data:`ROPE_TYPES`.

    ``rope_theta``, ``partial_rotary_factor`` (except for ``proportional``),
    ``mrope_section`` and ``mrope_interleaved`` are accepted and checked but
    are not part of the scaling: :func:`rope_from_transformers` reads them
    too, or pass them to RoPE yourself, as ``base=`` and
    ``rotary_dim=int(head_dim * partial_rotary_factor)``::

        params = config.rope_parameters        # or config.json's "rope_scaling"
        scaling = rope_scaling_from_transformers(
            params, max_position_embeddings=config.max_position_embeddings
        )
        rope = posenc.RotaryEmbedding(head_dim, base=params["rope_theta"], scaling=scaling)

    Parameters
    ----------
    rope_parameters
        The dict, or ``None``.
    max_position_embeddings
        The config's ``max_position_embeddings``.  Needed by ``dynamic`` (its
        training length, as transformers uses it), by ``longrope`` without
        ``factor`` (``factor = max / original``), and as the fallback training
        length of ``yarn``, ``llama3`` and ``longrope`` when
        ``original_max_position_embeddings`` is given nowhere.
    original_max_position_embeddings
        A training length stored next to the dict rather than in it (Phi-3's
        ``config.json``).  If the dict has one too, they must agree.

    Returns
    -------
    RopeScaling or None

    Examples
    --------
    >>> import posenc
    >>> posenc.rope_scaling_from_transformers({"rope_type": "dynamic", "factor": 2.0},
    ...                                       max_position_embeddings=4096)
    RopeScaling.dynamic_ntk(factor=2.0, original_max_positions=4096)
    >>> posenc.rope_scaling_from_transformers({"type": "linear", "factor": 4.0})  # older key
    RopeScaling.linear(factor=4.0)
    """
    if rope_parameters is None:
        return None
    if not isinstance(rope_parameters, Mapping):
        raise TypeError(
            f"rope_parameters must be a dict (a transformers rope_scaling or "
            f"rope_parameters) or None, got {type(rope_parameters).__name__}"
        )
    for key, value in rope_parameters.items():
        if isinstance(value, Mapping):
            raise ValueError(
                f"rope_parameters[{key!r}] is itself a dict: per-layer-type RoPE settings "
                f"(as in Gemma 3) must be read one layer type at a time, e.g. "
                f"from_transformers(rope_parameters[{key!r}]), or all at once by "
                f"rope_from_transformers"
            )
    params = dict(rope_parameters)
    rope_type, legacy_type = params.get("rope_type"), params.get("type")
    if rope_type is not None and legacy_type is not None and rope_type != legacy_type:
        raise ValueError(
            f"rope_parameters has rope_type={rope_type!r} and type={legacy_type!r}; "
            f"they name the same setting and must agree"
        )
    name = rope_type if rope_type is not None else legacy_type
    name = "default" if name is None else name
    if not isinstance(name, str):
        raise TypeError(f"rope_parameters['rope_type'] must be a string, got {name!r}")
    kind = ALIASES.get(name, name)
    if kind not in ROPE_TYPES:
        allowed = ", ".join(repr(k) for k in (*ROPE_TYPES, *ALIASES))
        raise ValueError(
            f"rope_parameters['rope_type'] must be one of the known types {allowed}, got {name!r}"
        )
    allowed_keys = (*COMMON_KEYS, *ROPE_TYPES[kind].keys)
    for key in params:
        if key not in allowed_keys:
            raise ValueError(
                f"rope_parameters[{key!r}] is not read by rope_type {name!r}, which "
                f"accepts {', '.join(repr(k) for k in allowed_keys)}"
            )
    # checked for the caller's sake, not used: they belong to RoPE, not to the scaling
    if params.get("rope_theta") is not None:
        check_float("rope_theta", params["rope_theta"], positive=True)
    if params.get("partial_rotary_factor") is not None:
        fraction = check_float("partial_rotary_factor", params["partial_rotary_factor"])
        may_be_zero = kind == "proportional"  # proportional may rotate nothing
        if not (0.0 <= fraction <= 1.0) or (fraction == 0.0 and not may_be_zero):
            interval = "[0, 1]" if may_be_zero else "(0, 1]"
            raise ValueError(
                f"partial_rotary_factor must be in {interval} for rope_type {name!r}, "
                f"got {fraction}"
            )
    if params.get("mrope_section") is not None:
        _mrope_sections(params)
    if max_position_embeddings is not None:
        max_position_embeddings = check_int(
            "max_position_embeddings", max_position_embeddings, minimum=1
        )
    config = _HFConfig(name, params, max_position_embeddings, original_max_position_embeddings)
    return ROPE_TYPES[kind].read(config)


def _mrope_sections(params: Mapping[str, Any]) -> tuple[int, ...]:
    sections = params["mrope_section"]
    if isinstance(sections, (str, bytes, Mapping)) or not hasattr(sections, "__iter__"):
        raise TypeError(
            f"rope_parameters['mrope_section'] must be a list of ints, got {sections!r}"
        )
    sections = tuple(sections)
    for i, v in enumerate(sections):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(
                f"rope_parameters['mrope_section'][{i}] must be a positive int, got {v!r}"
            )
    interleaved = params.get("mrope_interleaved", False)
    if not isinstance(interleaved, bool):
        raise TypeError(f"rope_parameters['mrope_interleaved'] must be a bool, got {interleaved!r}")
    return sections
