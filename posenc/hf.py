"""Hugging Face transformers configurations: ``rope_scaling`` / ``rope_parameters`` to posenc.

Two readers of the dict that transformers keeps in ``config.rope_scaling``
(4.x) or ``config.rope_parameters`` (5.x):

* :func:`rope_scaling_from_transformers` (also :meth:`RopeScaling.from_transformers`)
  returns the :class:`posenc.RopeScaling` that reproduces one flat dict, or
  ``None`` for plain RoPE;
* :func:`rope_from_transformers` returns the whole RoPE of a model, ready to
  rotate: a :class:`posenc.RotaryEmbedding` (base, ``partial_rotary_factor``
  as ``rotary_dim``, scaling), a :class:`posenc.mrope.MultimodalRotaryEmbedding`
  when the dict has ``mrope_section`` (Qwen-VL, GLM-V), or a dict with one of
  those per layer type when ``rope_parameters`` is nested by layer type
  (Gemma 3 and 4: ``{"sliding_attention": {...}, "full_attention": {...}}``).

Both are table-driven: :data:`ROPE_TYPES` maps each ``rope_type`` of
transformers 5.23's ``ROPE_INIT_FUNCTIONS`` (plus ``"default"``) to the keys
transformers reads for it and to a reader that builds the scaling; adding a
type is one entry there.  A key the type does not read or an unknown type
raises ``ValueError`` (the message lists the known types): a config this
cannot reproduce is refused, never approximated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, Union

from ._checks import check_choice, check_even, check_float, check_int
from .mrope import MultimodalRotaryEmbedding
from .rope import RotaryEmbedding
from .scaling import RopeScaling

#: What :func:`rope_from_transformers` builds for one layer type.
Rope: TypeAlias = Union[RotaryEmbedding, MultimodalRotaryEmbedding]  # noqa: UP007

__all__ = ["ROPE_TYPES", "rope_from_transformers", "rope_scaling_from_transformers"]

# keys every type accepts besides its own: they belong to RoPE, not to the scaling (checked
# here, used by rope_from_transformers)
COMMON_KEYS = (
    "rope_type", "type", "rope_theta", "partial_rotary_factor", "mrope_section",
    "mrope_interleaved",
)  # fmt: skip
ALIASES = {"su": "longrope"}  # Phi-3's first name for LongRoPE


@dataclass(frozen=True)
class _Config:
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


def _dynamic(c: _Config) -> RopeScaling:
    if c.max_position_embeddings is None:
        raise ValueError(
            "max_position_embeddings is required for rope_type 'dynamic': transformers "
            "grows the factor past it"
        )
    return RopeScaling.dynamic_ntk(c.required("factor"), c.max_position_embeddings)


def _yarn(c: _Config) -> RopeScaling:
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


def _llama3(c: _Config) -> RopeScaling:
    return RopeScaling.llama3(
        c.required("factor"),
        c.original(),
        c.required("low_freq_factor"),
        c.required("high_freq_factor"),
    )


def _longrope(c: _Config) -> RopeScaling:
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


def _proportional(c: _Config) -> RopeScaling:
    # transformers reads partial_rotary_factor here as the share of pairs that keep a frequency
    return RopeScaling.proportional(c.get("partial_rotary_factor", 1.0), c.get("factor", 1.0))


@dataclass(frozen=True)
class RopeType:
    """One transformers ``rope_type``: the keys it reads and how posenc reproduces it."""

    keys: tuple[str, ...]
    read: Callable[[_Config], RopeScaling | None]


#: transformers' ``rope_type`` -> the keys it reads (modeling_rope_utils, transformers 5.x)
#: and the reader that builds the scaling.
ROPE_TYPES: dict[str, RopeType] = {
    "default": RopeType((), lambda c: None),
    "linear": RopeType(("factor",), lambda c: RopeScaling.linear(c.required("factor"))),
    "dynamic": RopeType(("factor",), _dynamic),
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
        _yarn,
    ),  # fmt: skip
    "llama3": RopeType(
        ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
        _llama3,
    ),
    "longrope": RopeType(
        (
            "short_factor",
            "long_factor",
            "original_max_position_embeddings",
            "factor",
            "attention_factor",
        ),
        _longrope,
    ),  # fmt: skip
    "proportional": RopeType(("factor",), _proportional),
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
    config = _Config(name, params, max_position_embeddings, original_max_position_embeddings)
    return ROPE_TYPES[kind].read(config)


# ---------------------------------------------------------------------- whole RoPE


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


def rope_from_transformers(
    rope_parameters: Mapping[str, Any] | None,
    head_dim: int | Mapping[str, int],
    *,
    max_position_embeddings: int | None = None,
    original_max_position_embeddings: int | None = None,
    layout: str | Mapping[str, str] = "half",
    default_theta: float = 10000.0,
) -> RotaryEmbedding | MultimodalRotaryEmbedding | dict[str, Rope]:
    """The RoPE a transformers config describes, as posenc modules.

    Reads ``rope_parameters`` (or ``rope_scaling``) as
    :func:`rope_scaling_from_transformers` does, and also what belongs to RoPE
    itself:

    * ``rope_theta`` -> ``base`` (``default_theta`` when absent, as
      transformers' ``default_theta``);
    * ``partial_rotary_factor`` -> ``rotary_dim = int(head_dim * factor)``:
      the first ``rotary_dim`` features rotate, with a ladder over
      ``rotary_dim`` (GPT-NeoX, Phi, GLM); an odd ``rotary_dim`` is refused
      (transformers then turns ``ceil(r / 2)`` pairs with exponents over the
      odd ``r``, which no even split reproduces).  For
      ``rope_type="proportional"`` (Gemma 4) it is instead the scaling's
      ``rotated_fraction`` and the whole head rotates;
    * ``mrope_section`` -> a :class:`posenc.mrope.MultimodalRotaryEmbedding`
      with those sections, arranged ``"interleaved"`` when
      ``mrope_interleaved`` is true (Qwen3-VL), else ``"contiguous"``
      (Qwen2-VL, Qwen2.5-VL, GLM-4V);
    * a dict nested by layer type (every value a dict or ``None``, as
      Gemma 3/4's ``{"sliding_attention": {...}, "full_attention": {...}}``)
      -> a dict ``{layer_type: module}`` (``None`` entries skipped, as
      transformers skips them).

    Parameters
    ----------
    rope_parameters
        The dict (``config.rope_parameters``), or ``None`` for plain RoPE.
    head_dim
        The attention head size: an int, or for a nested dict a mapping
        ``{layer_type: int}`` (Gemma 4's full-attention layers use
        ``global_head_dim``).  DeepSeek's MLA rotates ``qk_rope_head_dim``.
    max_position_embeddings, original_max_position_embeddings
        As in :func:`rope_scaling_from_transformers`.
    layout
        Which features pair up: ``"half"`` (``rotate_half``: Llama, Gemma,
        Qwen, Phi, GPT-NeoX, DeepSeek with ``rope_interleave=False``) or
        ``"interleaved"`` (GLM's ``rotate_half_llm``).  transformers fixes it
        in the model code, not in the config, so it is a parameter here; a
        mapping ``{layer_type: layout}`` is accepted for nested dicts.
    default_theta
        The base when the dict has no ``rope_theta`` (the config class's
        ``default_theta``, 10000 for most models).

    Returns
    -------
    :class:`posenc.RotaryEmbedding`, :class:`posenc.mrope.MultimodalRotaryEmbedding`,
    or a dict of them by layer type.  ``module(x, positions)`` rotates ``x``
    ``(batch, heads, seq, head_dim)`` as the model's ``apply_rotary_pos_emb``
    does with its rotary embedding's cos/sin (positions ``(batch, seq)``, or
    ``(3, batch, seq)`` for M-RoPE).

    Examples
    --------
    >>> import posenc
    >>> params = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
    ...           "original_max_position_embeddings": 4096}
    >>> rope = posenc.rope_from_transformers(params, head_dim=64)
    >>> type(rope).__name__, rope.base, rope.layout, rope.scaling.kind
    ('RotaryEmbedding', 10000.0, 'half', 'yarn')
    >>> posenc.rope_from_transformers({"rope_theta": 1e6, "partial_rotary_factor": 0.5},
    ...                               head_dim=128).rotary_dim
    64

    A config nested by layer type (Gemma 3) gives one module per type:

    >>> gemma = posenc.rope_from_transformers(
    ...     {"sliding_attention": {"rope_theta": 1e4},
    ...      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}},
    ...     head_dim=256)
    >>> {name: (m.base, m.scaling) for name, m in gemma.items()}
    {'sliding_attention': (10000.0, None),
     'full_attention': (1000000.0, RopeScaling.linear(factor=8.0))}
    """
    if rope_parameters is None:
        rope_parameters = {}
    if not isinstance(rope_parameters, Mapping):
        raise TypeError(
            f"rope_parameters must be a dict (a transformers rope_parameters) or None, "
            f"got {type(rope_parameters).__name__}"
        )
    nested = [k for k, v in rope_parameters.items() if isinstance(v, Mapping)]
    if not nested:
        for name, value in (("head_dim", head_dim), ("layout", layout)):
            if isinstance(value, Mapping):
                raise ValueError(
                    f"{name} is a mapping by layer type, but rope_parameters is not nested "
                    f"by layer type"
                )
        return _one_rope(
            rope_parameters, head_dim, layout, default_theta,
            max_position_embeddings, original_max_position_embeddings,
        )  # fmt: skip
    flat = [k for k, v in rope_parameters.items() if v is not None and k not in nested]
    if flat:
        raise ValueError(
            f"rope_parameters mixes layer types {nested} with flat keys {flat}: nest every "
            f"setting under its layer type"
        )
    out = {}
    for layer_type in nested:
        dims = _per_layer("head_dim", head_dim, layer_type)
        lay = _per_layer("layout", layout, layer_type)
        try:
            out[layer_type] = _one_rope(
                rope_parameters[layer_type], dims, lay, default_theta,
                max_position_embeddings, original_max_position_embeddings,
            )  # fmt: skip
        except ValueError as e:
            raise ValueError(f"layer type {layer_type!r}: {e}") from None
    return out


def _per_layer(name: str, value: Any, layer_type: str) -> Any:
    if not isinstance(value, Mapping):
        return value
    if layer_type not in value:
        raise ValueError(f"{name} has no entry for layer type {layer_type!r}, got {dict(value)}")
    return value[layer_type]


def _one_rope(
    params: Mapping[str, Any],
    head_dim: Any,
    layout: Any,
    default_theta: float,
    max_positions: int | None,
    original: int | None,
) -> Rope:
    head_dim = check_int("head_dim", head_dim, minimum=2)
    layout = check_choice("layout", layout, ("half", "interleaved"))
    scaling = rope_scaling_from_transformers(
        params,
        max_position_embeddings=max_positions,
        original_max_position_embeddings=original,
    )
    base = params.get("rope_theta")
    base = check_float("default_theta", default_theta, positive=True) if base is None else base
    fraction = params.get("partial_rotary_factor")
    if fraction is None or (scaling is not None and scaling.kind == "proportional"):
        check_even("head_dim", head_dim)  # every feature is rotated, in pairs
    rotary_dim = head_dim
    if fraction is not None and (scaling is None or scaling.kind != "proportional"):
        rotary_dim = int(head_dim * fraction)  # as transformers computes it
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(
                f"partial_rotary_factor={fraction} gives int(head_dim * factor) = {rotary_dim} "
                f"rotated features of head_dim={head_dim}; posenc needs a positive even number"
            )
    if params.get("mrope_section") is not None:
        sections = _mrope_sections(params)
        arrangement = "interleaved" if params.get("mrope_interleaved", False) else "contiguous"
        return MultimodalRotaryEmbedding(
            head_dim, sections, base=base, layout=layout, rotary_dim=rotary_dim,
            scaling=scaling, arrangement=arrangement,
        )  # fmt: skip
    return RotaryEmbedding(
        head_dim, base=base, layout=layout, rotary_dim=rotary_dim, scaling=scaling
    )
