"""Per-layer position patterns, as 2025's models ship them, for the lab's :class:`TinyDecoder`.

Several released models give their layers different positional treatments:

=================  ===========================================================================
pattern            layers (``i`` from 0; every fourth layer is ``(i + 1) % 4 == 0``)
=================  ===========================================================================
``irope``          Llama 4 (iRoPE): RoPE with chunked attention on three layers of four; NoPE
                   with the query temperature :class:`posenc.TemperedNoPE` on every fourth
``rnope-swa``      Cohere's Command R7B / Command A: RoPE with a sliding window on three
                   layers of four; NoPE with full attention on every fourth
``smollm3``        SmolLM3: RoPE on three layers of four, NoPE on every fourth (all full)
``gemma3-bases``   Gemma 3: sliding-window layers with RoPE at a local base, full-attention
                   layers with RoPE at a base 100 times larger (Gemma 3: 10^4 and 10^6;
                   Gemma 3 has five local layers to each full one, the lab three)
=================  ===========================================================================

A pattern is a tuple of :class:`LayerSpec`, one per layer: a scheme (a name of
:data:`posenc.SCHEMES`, or ``None`` for the model's own scheme with the lab's
settings), options for its ``build``, an optional sliding window or chunk, and
Llama 4's temperature on a NoPE layer.  The lab's ``RoPE`` layers in these patterns
are ``None`` entries, so a pattern preset trains ``scheme="rope"`` with the pattern,
on the seeds of the 4-layer ``rope`` model without one (same initial weights, same
data): the only difference is the positional treatment.

Lengths scaled to the lab.  The released models' windows and chunks are thousands
of tokens (transformers 5.23's defaults: Cohere2Config ``sliding_window=4096`` at
``max_position_embeddings=8192``; Llama4TextConfig ``attention_chunk_size =
floor_scale = 8192``); at the lab's ``L = 32`` they would cover every context and
Llama 4's temperature would be 1 everywhere.  The lab keeps Cohere2Config's
proportion, a window of ``L / 2`` (``train_len // 2``), and uses it for every
pattern's local layers: Cohere's and Gemma 3's windows, and Llama 4's chunk, whose
size Llama 4's defaults tie to ``floor_scale``, so the lab's ``floor_scale`` is
``L / 2`` as well.  Then the temperature is 1 on the first ``L / 2 - 1``
positions, ``1 + 0.1 ln 2`` from there to position ``L - 2``, and ``1 + 0.1 ln(2c +
1)`` at the last position of a context ``c L``.  Gemma 3's bases
keep their ratio: the local base is the lab's ``rope_base`` (100, the base of every
lab model), the global one 100 times that.  The four patterns thus share their
three local layers' receptive field where they have one, and differ in the fourth.

:func:`layer_pattern` resolves a name of :data:`LAYER_PATTERNS` for a model;
:func:`pattern_from_layers` turns :func:`posenc.rope_layers_from_transformers`'s
report on a real config into a pattern.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import posenc

from .._checks import check_choice, check_float, check_int

__all__ = ["LAYER_PATTERNS", "LayerSpec", "layer_pattern", "pattern_from_layers"]


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer's positional treatment in a :class:`TinyDecoder` pattern.

    Parameters
    ----------
    scheme
        A name of :data:`posenc.SCHEMES` that acts on attention, or ``None``: the
        model's own scheme, with the lab's settings (``rope_base``, ...).
    options
        Keyword arguments for the scheme's ``build``, over the lab's settings
        (e.g. ``{"base": 1e4}`` for RoPE).
    window
        ``w``: query ``i`` attends to keys ``i - w < j <= i`` only, or ``None``.
    chunk
        ``c``: query ``i`` attends to keys ``j <= i`` with ``j // c == i // c``
        only (Llama 4's chunked attention), or ``None``.
    temperature
        ``(attn_scale, floor_scale)``: Llama 4's query temperature
        (:class:`posenc.TemperedNoPE`); only with ``scheme="none"``.

    Examples
    --------
    >>> from posenc.lab import LayerSpec
    >>> LayerSpec(window=16)
    LayerSpec(scheme=None, options={}, window=16, chunk=None, temperature=None)
    >>> LayerSpec("rope", temperature=(0.1, 8))
    Traceback (most recent call last):
    ...
    ValueError: temperature needs scheme 'none' (Llama 4's NoPE layers), got scheme 'rope'
    """

    scheme: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    window: int | None = None
    chunk: int | None = None
    temperature: tuple[float, int] | None = None

    def __post_init__(self) -> None:
        if self.scheme is not None:
            check_choice("scheme", self.scheme, tuple(posenc.SCHEMES))
            if posenc.SCHEMES[self.scheme].acts_on != "attention":
                raise ValueError(
                    f"scheme must act on attention in a layer pattern, got {self.scheme!r}"
                )
        if not isinstance(self.options, Mapping) or not all(
            isinstance(k, str) for k in self.options
        ):
            raise TypeError(f"options must be a mapping of str keys, got {self.options!r}")
        object.__setattr__(self, "options", dict(self.options))  # frozen: a private copy
        for name in ("window", "chunk"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), minimum=1)
        if self.temperature is not None:
            if self.scheme != "none":
                raise ValueError(
                    "temperature needs scheme 'none' (Llama 4's NoPE layers), got scheme "
                    f"{self.scheme!r}"
                )
            scale, floor = self.temperature
            check_float("attn_scale", scale, minimum=0.0)
            check_int("floor_scale", floor, minimum=1)
            object.__setattr__(self, "temperature", (float(scale), int(floor)))


def _every_fourth(i: int) -> bool:
    # transformers' default no_rope_layers / layer_types: (i + 1) % 4 == 0 is the odd one
    return (i + 1) % 4 == 0


def _irope(layers: int, train_len: int, rope_base: float) -> tuple[LayerSpec, ...]:
    local = max(1, train_len // 2)
    return tuple(
        LayerSpec("none", temperature=(0.1, local)) if _every_fourth(i) else LayerSpec(chunk=local)
        for i in range(layers)
    )


def _rnope_swa(layers: int, train_len: int, rope_base: float) -> tuple[LayerSpec, ...]:
    local = max(1, train_len // 2)
    return tuple(
        LayerSpec("none") if _every_fourth(i) else LayerSpec(window=local) for i in range(layers)
    )


def _smollm3(layers: int, train_len: int, rope_base: float) -> tuple[LayerSpec, ...]:
    return tuple(LayerSpec("none") if _every_fourth(i) else LayerSpec() for i in range(layers))


def _gemma3_bases(layers: int, train_len: int, rope_base: float) -> tuple[LayerSpec, ...]:
    local = max(1, train_len // 2)
    return tuple(
        LayerSpec("rope", {"base": 100.0 * rope_base})
        if _every_fourth(i)
        else LayerSpec("rope", {"base": rope_base}, window=local)
        for i in range(layers)
    )


#: The lab's per-layer patterns by name, each a function ``(layers, train_len,
#: rope_base) -> tuple[LayerSpec, ...]`` (see the module docstring for what each
#: ships and how its lengths are scaled); :func:`layer_pattern` calls them.
LAYER_PATTERNS: dict[str, Callable[[int, int, float], tuple[LayerSpec, ...]]] = {
    "irope": _irope,
    "rnope-swa": _rnope_swa,
    "smollm3": _smollm3,
    "gemma3-bases": _gemma3_bases,
}


def layer_pattern(
    name: str, layers: int, train_len: int, rope_base: float = 100.0
) -> tuple[LayerSpec, ...]:
    """The pattern ``name`` (a key of :data:`LAYER_PATTERNS`) for a model of ``layers`` layers.

    Parameters
    ----------
    name
        A key of :data:`LAYER_PATTERNS`; anything else raises ``ValueError``.
    layers
        The model's depth (``>= 1``); the odd layer is every fourth one.
    train_len
        The model's training length ``L``: windows, chunks and Llama 4's
        ``floor_scale`` are ``L // 2``.
    rope_base
        The lab's RoPE base (Gemma 3's local base; its global base is 100 times it).

    Returns
    -------
    One :class:`LayerSpec` per layer.

    Examples
    --------
    >>> from posenc.lab import layer_pattern
    >>> [(s.scheme, s.window) for s in layer_pattern("rnope-swa", 4, 32)]
    [(None, 16), (None, 16), (None, 16), ('none', None)]
    >>> layer_pattern("irope", 4, 32)[3].temperature
    (0.1, 16)
    """
    check_choice("name", name, tuple(LAYER_PATTERNS))
    layers = check_int("layers", layers, minimum=1)
    train_len = check_int("train_len", train_len, minimum=1)
    rope_base = check_float("rope_base", rope_base, positive=True)
    return LAYER_PATTERNS[name](layers, train_len, rope_base)


def pattern_from_layers(
    report: Sequence[posenc.LayerPositions], *, length_ratio: float = 1.0
) -> tuple[LayerSpec, ...]:
    """A lab pattern from :func:`posenc.rope_layers_from_transformers`'s report on a config.

    Each layer keeps whether it rotates, its RoPE base and layout, its sliding
    window or chunk, and Llama 4's temperature; windows, chunks and the
    temperature's ``floor_scale`` are multiplied by ``length_ratio`` (the lab's
    training length over the model's, say) and rounded up.  A RoPE scaling of the
    config (Llama 4 Scout's ``llama3``) is left out: it extends a trained model's
    context, which the lab does at test time (:meth:`TinyDecoder.set_rope_scaling`).

    Parameters
    ----------
    report
        The :class:`posenc.LayerPositions` of every layer.
    length_ratio
        Multiplies every length (``> 0``).

    Returns
    -------
    One :class:`LayerSpec` per layer, every scheme explicit (``"rope"`` with
    ``base`` and ``layout``, or ``"none"``).  A partial or multimodal RoPE raises
    ``ValueError`` (the lab's layers rotate every feature of one position).

    Examples
    --------
    >>> import posenc
    >>> from posenc.lab import pattern_from_layers
    >>> from transformers import Cohere2Config
    >>> config = Cohere2Config(num_hidden_layers=4, hidden_size=64, num_attention_heads=4)
    >>> report = posenc.rope_layers_from_transformers(config)  # window 4096 of 8192
    >>> [(s.scheme, s.options.get("base"), s.window)
    ...  for s in pattern_from_layers(report, length_ratio=32 / 8192)]
    [('rope', 10000.0, 16), ('rope', 10000.0, 16), ('rope', 10000.0, 16), ('none', None, None)]
    """
    ratio = check_float("length_ratio", length_ratio, positive=True)

    def scaled(n: int | None) -> int | None:
        return None if n is None else max(1, math.ceil(n * ratio))

    out = []
    for i, layer in enumerate(report):
        if not isinstance(layer, posenc.LayerPositions):
            raise TypeError(
                f"report must hold posenc.LayerPositions, got {type(layer).__name__} at {i}"
            )
        window, chunk = scaled(layer.sliding_window), scaled(layer.chunk)
        rope = layer.rope
        if rope is None:
            temperature = layer.temperature
            if temperature is not None:
                floor = scaled(temperature[1])
                assert floor is not None
                temperature = (temperature[0], floor)
            out.append(LayerSpec("none", window=window, chunk=chunk, temperature=temperature))
            continue
        if not isinstance(rope, posenc.RotaryEmbedding) or rope.rotary_dim != rope.dim:
            raise ValueError(
                f"layer {i}: the lab's pattern needs a RotaryEmbedding that rotates every "
                f"feature, got {type(rope).__name__}"
            )
        options = {"base": rope.base, "layout": rope.layout}
        out.append(LayerSpec("rope", options, window=window, chunk=chunk))
    return tuple(out)
