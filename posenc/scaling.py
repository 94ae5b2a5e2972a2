"""RoPE context-extension scalings: PI, NTK, dynamic NTK, YaRN, Llama 3.1, LongRoPE.

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
``longrope``       LongRoPE (Ding et al., 2024), as in Phi-3: one searched
                   divisor per frequency, ``short_factor`` up to the training
                   length and ``long_factor`` past it, plus an attention
                   factor ``sqrt(1 + ln(factor) / ln(original_max_positions))``
=================  ==========================================================

Frequencies are computed in float64.  The formulas and constants follow the
papers as the model families implement them (Hugging Face transformers'
``modeling_rope_utils``: YaRN's integer-rounded correction range, Llama 3.1's
band edges, LongRoPE's switch at the training length), and
:meth:`RopeScaling.from_transformers` reads a transformers configuration.

``dynamic_ntk`` and ``longrope`` depend on the current length
(:attr:`RopeScaling.depends_on_length`): their frequencies are a function of
``seq_len``, the number of positions in play (transformers uses the largest
position id plus one).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ._checks import check_choice, check_even, check_float, check_int
from .sinusoidal import sinusoidal_inv_freq  # RoPE reuses the sinusoid's frequency ladder

__all__ = ["RopeScaling"]

_KINDS = ("linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope")
_NEEDS_ORIGINAL = ("dynamic_ntk", "yarn", "llama3", "longrope")
# fields that belong to one kind; setting them for another kind is refused
_KIND_FIELDS = {
    "beta_fast": "yarn",
    "beta_slow": "yarn",
    "truncate": "yarn",
    "low_freq_factor": "llama3",
    "high_freq_factor": "llama3",
    "short_factor": "longrope",
    "long_factor": "longrope",
}
_ATTENTION_KINDS = ("yarn", "longrope")

# transformers' names: rope_type -> the keys it reads besides rope_type/type,
# rope_theta and partial_rotary_factor (modeling_rope_utils, transformers 5.x)
_TRANSFORMERS_KEYS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    ),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
    "longrope": (
        "short_factor",
        "long_factor",
        "original_max_position_embeddings",
        "factor",
        "attention_factor",
    ),
}
_TRANSFORMERS_ALIASES = {"su": "longrope"}  # Phi-3's first name for LongRoPE
_TRANSFORMERS_COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE frequency scaling, validated when it is built.

    Build one with :meth:`linear`, :meth:`ntk`, :meth:`dynamic_ntk`,
    :meth:`yarn`, :meth:`llama3`, :meth:`longrope` or
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
        ``"llama3"``, ``"longrope"``.
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
    attention_factor
        Multiplier applied to rotated queries *and* keys by
        :func:`posenc.apply_rope` (so scores scale by its square).  Only YaRN
        and LongRoPE have one: by default ``0.1 ln(factor) + 1`` for YaRN and
        ``sqrt(1 + ln(factor) / ln(original_max_positions))`` for LongRoPE;
        1 for every other kind.
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
    attention_factor: float | None = None

    def __post_init__(self):
        def put(name, value):  # the dataclass is frozen: normalise fields once, here
            object.__setattr__(self, name, value)

        if not isinstance(self.kind, str):
            raise TypeError(f"kind must be a string, got {type(self.kind).__name__}")
        kind = check_choice("kind", self.kind, _KINDS)
        put("factor", check_float("factor", self.factor, minimum=1.0))

        if kind in _NEEDS_ORIGINAL:
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
            raise ValueError(
                f"original_max_positions does not apply to kind {kind!r} (only to "
                f"{', '.join(repr(k) for k in _NEEDS_ORIGINAL)}), "
                f"got {self.original_max_positions!r}"
            )

        for name, owner in _KIND_FIELDS.items():
            if getattr(self, name) is not None and kind != owner:
                raise ValueError(
                    f"{name} applies only to kind {owner!r}, not {kind!r}; "
                    f"got {name}={getattr(self, name)!r}"
                )

        if kind == "yarn":
            fast = check_float("beta_fast", _default(self.beta_fast, 32.0), positive=True)
            slow = check_float("beta_slow", _default(self.beta_slow, 1.0), positive=True)
            if fast <= slow:
                raise ValueError(f"beta_fast must be > beta_slow, got {fast} <= {slow}")
            truncate = _default(self.truncate, True)
            if not isinstance(truncate, bool):
                raise TypeError(f"truncate must be a bool, got {type(truncate).__name__}")
            put("beta_fast", fast)
            put("beta_slow", slow)
            put("truncate", truncate)
        elif kind == "llama3":
            low = check_float("low_freq_factor", _default(self.low_freq_factor, 1.0), positive=True)
            high = check_float(
                "high_freq_factor", _default(self.high_freq_factor, 4.0), positive=True
            )
            if high <= low:
                raise ValueError(f"high_freq_factor must be > low_freq_factor, got {high} <= {low}")
            put("low_freq_factor", low)
            put("high_freq_factor", high)
        elif kind == "longrope":
            short = _check_factor_list("short_factor", self.short_factor)
            long = _check_factor_list("long_factor", self.long_factor)
            if len(short) != len(long):
                raise ValueError(
                    f"short_factor and long_factor must have the same length (dim // 2), "
                    f"got {len(short)} and {len(long)}"
                )
            put("short_factor", short)
            put("long_factor", long)

        if self.attention_factor is None:
            put("attention_factor", self._default_attention_factor())
        elif kind not in _ATTENTION_KINDS:
            raise ValueError(
                f"attention_factor applies only to kinds 'yarn' and 'longrope', not {kind!r}; "
                f"got attention_factor={self.attention_factor!r}"
            )
        else:
            put(
                "attention_factor",
                check_float("attention_factor", self.attention_factor, positive=True),
            )

    def _default_attention_factor(self) -> float:
        s = self.factor
        if self.kind == "yarn":
            return _yarn_mscale(s)
        if self.kind == "longrope" and s > 1.0:
            if self.original_max_positions < 2:
                raise ValueError(
                    "original_max_positions must be >= 2 for LongRoPE's default attention factor "
                    f"sqrt(1 + ln(factor) / ln(original_max_positions)), got "
                    f"{self.original_max_positions}; give attention_factor explicitly"
                )
            return math.sqrt(1.0 + math.log(s) / math.log(self.original_max_positions))
        return 1.0

    # ------------------------------------------------------------------ constructors

    @classmethod
    def linear(cls, factor: float) -> RopeScaling:
        """Position interpolation (Chen et al., 2023): ``omega_i / factor``."""
        return cls("linear", factor)

    @classmethod
    def ntk(cls, factor: float) -> RopeScaling:
        """NTK-aware scaling (bloc97, 2023): base becomes ``base * factor**(dim / (dim - 2))``."""
        return cls("ntk", factor)

    @classmethod
    def dynamic_ntk(cls, factor: float, original_max_positions: int) -> RopeScaling:
        """Dynamic NTK: the NTK base change with a factor that grows with the length.

        For a current length ``L = max(seq_len, original_max_positions)`` the
        base becomes ``base * (factor * L / original - (factor - 1))**(dim / (dim - 2))``,
        so nothing changes up to the training length.
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
        """Llama 3.1 (Grattafiori et al., 2024), by wavelength ``lambda_i = 2 pi / omega_i``.

        * ``lambda_i < original / high_freq_factor``: unchanged;
        * ``lambda_i > original / low_freq_factor``: divided by ``factor``;
        * in between: ``(1 - a) omega_i / factor + a omega_i`` with
          ``a = (original / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``.
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
        short_factor,
        long_factor,
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
        """
        return cls(
            "longrope",
            factor,
            original_max_positions,
            short_factor=short_factor,
            long_factor=long_factor,
            attention_factor=attention_factor,
        )

    @classmethod
    def from_transformers(
        cls,
        rope_parameters: Mapping | None,
        *,
        max_position_embeddings: int | None = None,
        original_max_position_embeddings: int | None = None,
    ) -> RopeScaling | None:
        """Read a Hugging Face transformers ``rope_scaling`` or ``rope_parameters`` dict.

        Returns ``None`` for ``rope_type`` ``"default"`` (or ``None``/``{}``),
        which means plain RoPE.  The dict's keys are transformers' own:
        ``rope_type`` (or the older ``type``; ``"su"`` is read as
        ``"longrope"``), ``factor``, ``original_max_position_embeddings``,
        ``attention_factor``, ``beta_fast``, ``beta_slow``, ``mscale``,
        ``mscale_all_dim``, ``truncate`` (yarn), ``low_freq_factor``,
        ``high_freq_factor`` (llama3), ``short_factor``, ``long_factor``
        (longrope).  A key that the type does not read, a nested per-layer
        dict or an unknown type raises ``ValueError``: a config this cannot
        reproduce is refused, never approximated.

        ``rope_theta`` and ``partial_rotary_factor`` (which transformers 5
        keeps in ``rope_parameters``) are accepted and checked but are not part
        of the scaling: pass them to RoPE yourself, as ``base=`` and
        ``rotary_dim=int(head_dim * partial_rotary_factor)``::

            params = config.rope_parameters        # or config.json's "rope_scaling"
            scaling = RopeScaling.from_transformers(
                params, max_position_embeddings=config.max_position_embeddings
            )
            rope = posenc.RotaryEmbedding(head_dim, base=params["rope_theta"], scaling=scaling)

        Parameters
        ----------
        rope_parameters
            The dict, or ``None``.
        max_position_embeddings
            The config's ``max_position_embeddings``.  Needed by ``dynamic``
            (its training length, as transformers uses it), by ``longrope``
            without ``factor`` (``factor = max / original``), and as the
            fallback training length of ``yarn``, ``llama3`` and ``longrope``
            when ``original_max_position_embeddings`` is given nowhere.
        original_max_position_embeddings
            A training length stored next to the dict rather than in it (Phi-3's
            ``config.json``).  If the dict has one too, they must agree.

        Returns
        -------
        RopeScaling or None
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
                    f"from_transformers(rope_parameters[{key!r}])"
                )
        params = dict(rope_parameters)
        rope_type = params.get("rope_type")
        legacy_type = params.get("type")
        if rope_type is not None and legacy_type is not None and rope_type != legacy_type:
            raise ValueError(
                f"rope_parameters has rope_type={rope_type!r} and type={legacy_type!r}; "
                f"they name the same setting and must agree"
            )
        name = rope_type if rope_type is not None else legacy_type
        name = "default" if name is None else name
        if not isinstance(name, str):
            raise TypeError(f"rope_parameters['rope_type'] must be a string, got {name!r}")
        kind = _TRANSFORMERS_ALIASES.get(name, name)
        if kind not in _TRANSFORMERS_KEYS:
            allowed = ", ".join(repr(k) for k in (*_TRANSFORMERS_KEYS, *_TRANSFORMERS_ALIASES))
            raise ValueError(f"rope_parameters['rope_type'] must be one of {allowed}, got {name!r}")
        allowed_keys = (*_TRANSFORMERS_COMMON_KEYS, *_TRANSFORMERS_KEYS[kind])
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
            if not 0.0 < fraction <= 1.0:
                raise ValueError(f"partial_rotary_factor must be in (0, 1], got {fraction}")
        if max_position_embeddings is not None:
            max_position_embeddings = check_int(
                "max_position_embeddings", max_position_embeddings, minimum=1
            )

        def required(key):
            if params.get(key) is None:
                raise ValueError(f"rope_parameters[{key!r}] is required for rope_type {name!r}")
            return params[key]

        def original():
            given = params.get("original_max_position_embeddings")
            outside = original_max_position_embeddings
            if given is not None and outside is not None and given != outside:
                raise ValueError(
                    f"rope_parameters['original_max_position_embeddings']={given!r} and "
                    f"original_max_position_embeddings={outside!r} disagree"
                )
            length = next(
                (v for v in (given, outside, max_position_embeddings) if v is not None), None
            )
            if length is None:
                raise ValueError(
                    f"rope_type {name!r} needs the training length: "
                    f"rope_parameters['original_max_position_embeddings'], or the keyword "
                    f"original_max_position_embeddings or max_position_embeddings"
                )
            return check_int("original_max_position_embeddings", length, minimum=1)

        if kind == "default":
            return None
        if kind == "linear":
            return cls.linear(required("factor"))
        if kind == "dynamic":
            if max_position_embeddings is None:
                raise ValueError(
                    "max_position_embeddings is required for rope_type 'dynamic': transformers "
                    "grows the factor past it"
                )
            return cls.dynamic_ntk(required("factor"), max_position_embeddings)
        if kind == "yarn":
            return cls.yarn(
                required("factor"),
                original(),
                _default(params.get("beta_fast"), 32.0),
                _default(params.get("beta_slow"), 1.0),
                truncate=_default(params.get("truncate"), True),
                attention_factor=params.get("attention_factor"),
                mscale=params.get("mscale"),
                mscale_all_dim=params.get("mscale_all_dim"),
            )
        if kind == "llama3":
            return cls.llama3(
                required("factor"),
                original(),
                required("low_freq_factor"),
                required("high_freq_factor"),
            )
        # longrope
        short, long = required("short_factor"), required("long_factor")
        orig = original()
        factor = params.get("factor")
        if factor is None:
            if max_position_embeddings is None:
                raise ValueError(
                    "rope_type 'longrope' needs rope_parameters['factor'] or "
                    "max_position_embeddings (factor = max_position_embeddings / "
                    "original_max_position_embeddings)"
                )
            factor = max_position_embeddings / orig
            if factor < 1.0:
                raise ValueError(
                    f"max_position_embeddings / original_max_position_embeddings must be >= 1 "
                    f"for longrope, got {max_position_embeddings} / {orig}"
                )
        return cls.longrope(
            short, long, orig, factor, attention_factor=params.get("attention_factor")
        )

    # ------------------------------------------------------------------ behaviour

    @property
    def depends_on_length(self) -> bool:
        """True when the frequencies depend on ``seq_len`` (``dynamic_ntk``, ``longrope``)."""
        return self.kind in ("dynamic_ntk", "longrope")

    def frequencies(self, dim: int, base: float = 10000.0, seq_len: int | None = None):
        """Scaled frequencies, a float64 CPU tensor of shape ``(dim // 2,)``.

        ``seq_len`` (the current context length) matters only when
        :attr:`depends_on_length`; ``None`` means "no longer than the training
        context".
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
        if self.kind == "longrope":
            if len(self.short_factor) != dim // 2:
                raise ValueError(
                    f"short_factor and long_factor have {len(self.short_factor)} entries, "
                    f"one per frequency, so dim must be {2 * len(self.short_factor)}, got {dim}"
                )
            long = seq_len is not None and seq_len > self.original_max_positions
            divisors = self.long_factor if long else self.short_factor
            return omega / torch.tensor(divisors, dtype=torch.float64)
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

        low, high = index_for(self.beta_fast), index_for(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
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
            if not self.truncate:
                args.append("truncate=False")
        if self.kind == "llama3":
            args += [
                f"low_freq_factor={self.low_freq_factor}",
                f"high_freq_factor={self.high_freq_factor}",
            ]
        if self.kind == "longrope":
            args = [
                f"short_factor={_brief(self.short_factor)}",
                f"long_factor={_brief(self.long_factor)}",
                *args[::-1],
            ]
        if self.kind in _ATTENTION_KINDS:
            args.append(f"attention_factor={self.attention_factor}")
        return f"RopeScaling.{self.kind}({', '.join(args)})"


def _default(value, default):
    return default if value is None else value


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's temperature ``0.1 mscale ln(factor) + 1`` (1 when ``factor <= 1``)."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def _check_factor_list(name: str, values) -> tuple[float, ...]:
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
