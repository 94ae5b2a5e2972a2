"""Hugging Face transformers configurations: ``rope_scaling`` / ``rope_parameters`` to posenc.

:func:`rope_scaling_from_transformers` (also ``RopeScaling.from_transformers``)
reads the dict that transformers keeps in ``config.rope_scaling`` (4.x) or
``config.rope_parameters`` (5.x) and returns the :class:`posenc.RopeScaling`
that reproduces it, or ``None`` for plain RoPE.  It is table-driven:
:data:`ROPE_TYPES` maps each ``rope_type`` to the keys transformers reads for
it and to a reader that builds the scaling; adding a type is one entry there.
A key the type does not read, a nested per-layer dict or an unknown type
raises ``ValueError``: a config this cannot reproduce is refused, never
approximated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ._checks import check_float, check_int
from .scaling import RopeScaling

__all__ = ["ROPE_TYPES", "rope_scaling_from_transformers"]

# keys every type accepts besides its own (rope_theta and partial_rotary_factor belong to
# RoPE, not to the scaling: checked, not used)
COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
ALIASES = {"su": "longrope"}  # Phi-3's first name for LongRoPE


@dataclass(frozen=True)
class _Config:
    """The dict being read, and the lengths given next to it."""

    name: str
    params: dict
    max_position_embeddings: int | None
    original_max_position_embeddings: int | None

    def required(self, key):
        if self.params.get(key) is None:
            raise ValueError(f"rope_parameters[{key!r}] is required for rope_type {self.name!r}")
        return self.params[key]

    def get(self, key, default=None):
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
}


def rope_scaling_from_transformers(
    rope_parameters: Mapping | None,
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
    ``short_factor``, ``long_factor`` (longrope); see :data:`ROPE_TYPES`.

    ``rope_theta`` and ``partial_rotary_factor`` (which transformers 5 keeps
    in ``rope_parameters``) are accepted and checked but are not part of the
    scaling: pass them to RoPE yourself, as ``base=`` and
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
        raise ValueError(f"rope_parameters['rope_type'] must be one of {allowed}, got {name!r}")
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
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {fraction}")
    if max_position_embeddings is not None:
        max_position_embeddings = check_int(
            "max_position_embeddings", max_position_embeddings, minimum=1
        )
    config = _Config(name, params, max_position_embeddings, original_max_position_embeddings)
    return ROPE_TYPES[kind].read(config)


def _from_transformers(
    cls,
    rope_parameters: Mapping | None,
    *,
    max_position_embeddings: int | None = None,
    original_max_position_embeddings: int | None = None,
) -> RopeScaling | None:
    """Alias of :func:`posenc.hf.rope_scaling_from_transformers` (same arguments)."""
    return rope_scaling_from_transformers(
        rope_parameters,
        max_position_embeddings=max_position_embeddings,
        original_max_position_embeddings=original_max_position_embeddings,
    )


# RopeScaling.from_transformers, the name users know, lives here with the parsing: scaling.py
# stays free of transformers' vocabulary and cannot import this module (it imports scaling)
RopeScaling.from_transformers = classmethod(_from_transformers)
