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
  (Gemma 3 and 4: ``{"sliding_attention": {...}, "full_attention": {...}}``);
* :func:`rope_layers_from_transformers` reads a whole model config and says, layer
  by layer, how it treats positions (:class:`LayerPositions`: which layers rotate and
  with which RoPE, which are NoPE, which attend through a sliding window or in
  chunks, which carry Llama 4's query temperature), for the per-layer patterns that
  2025's models ship (Llama 4, Cohere2, SmolLM3, Gemma 3).

The first, with its table :data:`ROPE_TYPES`, is defined in :mod:`posenc.scaling`
beside the scalings it builds, and re-exported here: this module imports
``posenc.rope`` and ``posenc.mrope``, which import ``posenc.scaling``, so a reader
defined here could not serve :meth:`RopeScaling.from_transformers` without an import
circle.  Both are table-driven: :data:`ROPE_TYPES` maps each ``rope_type`` of
transformers 5.23's ``ROPE_INIT_FUNCTIONS`` (plus ``"default"``) to the keys
transformers reads for it and to a reader that builds the scaling; adding a
type is one entry there.  A key the type does not read or an unknown type
raises ``ValueError`` (the message lists the known types): a config this
cannot reproduce is refused, never approximated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeAlias, Union

from ._checks import check_choice, check_even, check_float, check_int
from .mrope import MultimodalRotaryEmbedding
from .rope import RotaryEmbedding
from .scaling import (  # the reader of one flat dict lives beside the scalings it builds
    ROPE_TYPES,
    _mrope_sections,
    rope_scaling_from_transformers,
)

#: What :func:`rope_from_transformers` builds for one layer type.
Rope: TypeAlias = Union[RotaryEmbedding, MultimodalRotaryEmbedding]  # noqa: UP007

__all__ = [
    "ROPE_TYPES",
    "ROPE_LAYER_FAMILIES",
    "LayerPositions",
    "rope_from_transformers",
    "rope_layers_from_transformers",
    "rope_scaling_from_transformers",
]

# ---------------------------------------------------------------------- whole RoPE


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


# ---------------------------------------------------------------------- per layer


@dataclasses.dataclass(frozen=True)
class LayerPositions:
    """How one attention layer of a transformers model treats positions.

    What :func:`rope_layers_from_transformers` reports for each layer.

    Parameters
    ----------
    layer_type
        The layer's entry of ``config.layer_types`` (``"full_attention"``,
        ``"sliding_attention"`` or ``"chunked_attention"``).
    rope
        The RoPE the layer applies to its queries and keys, or ``None`` for a
        NoPE layer (no rotation).
    sliding_window
        ``w``: query ``i`` sees keys ``i - w < j <= i`` (transformers'
        ``sliding_window_overlay``), or ``None``.
    chunk
        ``c``: query ``i`` sees keys ``j <= i`` with ``j // c == i // c`` (Llama 4's
        chunked attention, ``chunked_overlay``), or ``None``.
    temperature
        ``(attn_scale, floor_scale)`` of Llama 4's query temperature on a NoPE layer
        (:class:`posenc.TemperedNoPE`), or ``None``.

    Examples
    --------
    >>> import posenc
    >>> layer = posenc.LayerPositions("sliding_attention", posenc.RotaryEmbedding(8),
    ...                               sliding_window=4)
    >>> layer.base, layer.rotates
    (10000.0, True)
    """

    layer_type: str
    rope: Rope | None
    sliding_window: int | None = None
    chunk: int | None = None
    temperature: tuple[float, int] | None = None

    @property
    def rotates(self) -> bool:
        """Whether the layer applies RoPE."""
        return self.rope is not None

    @property
    def base(self) -> float | None:
        """The RoPE base of the layer, ``None`` for a NoPE layer."""
        return None if self.rope is None else self.rope.base


#: The model types :func:`rope_layers_from_transformers` reads (a composite config, such
#: as Llama 4's or Gemma 3's with a vision tower, is read through its text config).
ROPE_LAYER_FAMILIES = ("llama4_text", "cohere2", "smollm3", "gemma3_text")


def rope_layers_from_transformers(config: Any) -> tuple[LayerPositions, ...]:
    """Per layer, how a transformers config's model treats positions.

    Reads the config's attributes as transformers 5.23's modeling code reads them,
    for the families that mix RoPE and NoPE or two RoPE bases across layers:

    * ``llama4_text`` (Llama 4, iRoPE): a layer rotates when
      ``config.no_rope_layers[i]`` is 1 (``Llama4TextAttention.use_rope``); a
      ``"chunked_attention"`` layer type attends in chunks of
      ``config.attention_chunk_size``; a NoPE layer carries the query temperature
      ``(config.attn_scale, config.floor_scale)`` when
      ``config.attn_temperature_tuning``.  RoPE pairs adjacent features
      (``apply_rotary_emb``'s complex view: ``layout="interleaved"``);
    * ``cohere2`` (Command R7B, Command A): only the ``"sliding_attention"``
      layers rotate, with window ``config.sliding_window``
      (``Cohere2Attention.sliding_window``, which gates ``apply_rotary_pos_emb``);
      pairs adjacent features (its ``rotate_half`` splits ``x[..., ::2]``);
    * ``smollm3``: a layer rotates when ``config.no_rope_layers[i]`` is 1
      (``SmolLM3Attention.use_rope``); a window of ``config.sliding_window`` when
      ``config.use_sliding_window`` and the layer type is ``"sliding_attention"``;
      ``layout="half"``;
    * ``gemma3_text``: every layer rotates, with the RoPE of its layer type in the
      nested ``config.rope_parameters`` (base ``rope_local_base_freq``, 10^4 by
      default, on ``"sliding_attention"`` layers; 10^6 on ``"full_attention"``
      ones); window ``config.sliding_window`` on sliding layers; ``layout="half"``.
      A bidirectional config (``use_bidirectional_attention``) is refused.

    Parameters
    ----------
    config
        A transformers ``PretrainedConfig`` of one of :data:`ROPE_LAYER_FAMILIES` (or a
        composite config whose ``get_text_config()`` is one).

    Returns
    -------
    One :class:`LayerPositions` per layer, in order.  Layers of one RoPE share one
    module.  Anything else a config may say (qk-norm, logit soft-capping, MoE) is
    not positional and not reported; a model type not in :data:`ROPE_LAYER_FAMILIES`
    raises ``ValueError``.

    Examples
    --------
    >>> import posenc
    >>> from transformers import Cohere2Config
    >>> config = Cohere2Config(num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
    ...                        sliding_window=16)
    >>> [(p.layer_type, p.base, p.sliding_window)
    ...  for p in posenc.rope_layers_from_transformers(config)]
    [('sliding_attention', 10000.0, 16), ('sliding_attention', 10000.0, 16),
     ('sliding_attention', 10000.0, 16), ('full_attention', None, None)]
    """
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    family = getattr(config, "model_type", None)
    if family not in ROPE_LAYER_FAMILIES:
        raise ValueError(
            f"config must be a transformers config of model type "
            f"{', '.join(map(repr, ROPE_LAYER_FAMILIES))}, got model type {family!r}"
        )
    layers = check_int("num_hidden_layers", config.num_hidden_layers, minimum=1)
    types = list(config.layer_types)
    if len(types) != layers:
        raise ValueError(f"config.layer_types must have {layers} entries, got {len(types)}")
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads
    )
    layout = "interleaved" if family in ("llama4_text", "cohere2") else "half"
    if family == "gemma3_text" and getattr(config, "use_bidirectional_attention", False):
        raise ValueError("config.use_bidirectional_attention must be False (a causal Gemma 3)")
    rope = rope_from_transformers(
        config.rope_parameters, head_dim, layout=layout,
        max_position_embeddings=config.max_position_embeddings,
    )  # fmt: skip
    out = []
    for i, layer_type in enumerate(types):
        window = chunk = temperature = None
        if family in ("llama4_text", "smollm3"):
            rotates = bool(config.no_rope_layers[i])
        else:
            rotates = family == "gemma3_text" or (
                layer_type == "sliding_attention" and config.sliding_window is not None
            )
        if layer_type == "sliding_attention" and (family != "smollm3" or config.use_sliding_window):
            window = config.sliding_window
        if family == "llama4_text":
            if layer_type == "chunked_attention":
                chunk = config.attention_chunk_size
                if chunk is None:  # transformers' create_chunked_causal_mask refuses it too
                    raise ValueError(
                        f"layer {i} is chunked_attention but config.attention_chunk_size is None"
                    )
            if config.attn_temperature_tuning and not rotates:
                temperature = (float(config.attn_scale), int(config.floor_scale))
        layer_rope = None
        if rotates:
            layer_rope = rope[layer_type] if isinstance(rope, dict) else rope
        out.append(LayerPositions(layer_type, layer_rope, window, chunk, temperature))
    return tuple(out)
