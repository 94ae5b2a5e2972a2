"""posenc: positional encodings for transformers, exact and fast.

Every public name is re-exported here from the module that owns it:

=====================  ======================================================
module                 what lives there
=====================  ======================================================
``scheme``             the :class:`PositionalScheme` contract every scheme
                       follows (hooks, metadata, uniform construction) and
                       :class:`NoPE`
``context``            :class:`CallContext`, what the hooks know about a call
``registry``           :data:`SCHEMES`, short name -> scheme class, and
                       :func:`scheme_table`
``attend``             :func:`attention`, the one entry point, and
                       :func:`attention_weights`
``masks``              the causal mask and :func:`merge_masks`
``sdpa``               the attention math a scheme's ``attend`` is built from:
                       :func:`scaled_dot_product`, :func:`softmax_weights`,
                       :func:`dot_scores`, :func:`repeat_kv`
``flex``               fused attention through FlexAttention with a scheme's
                       ``score_mod``: no O(n^2) bias (``backend=``)
``kv_cache``           a decoding cache for any scheme (``KVCache``)
``scaling``            RoPE context-extension scalings (PI, NTK, YaRN, Llama 3.1)
``hf``                 RoPE scalings from transformers configs
``mrope``              multimodal RoPE sections of (t, h, w) positions
                       (Qwen2-VL, Qwen3-VL, GLM-4V)
``convert``            checkpoint conversion between RoPE layouts
``multidim``           grid positions: the 2-D (N-D) sin-cos table of MAE/MoCo v3, DETR
                       and axial RoPE for image patches (Heo et al., 2024)
schemes                one module each, listed in :data:`SCHEMES`: ``sinusoidal``,
                       ``learned``, ``rope``, ``alibi``, ``t5``, ``shaw``,
                       ``transformer_xl``, ``da_transformer``, ...
``analysis``           helpers for the book's derivations (needs SciPy)
``viz``                plot helpers shared by chapters (needs Matplotlib)
=====================  ======================================================

``analysis`` and ``viz`` load on first use, so ``import posenc`` needs only
PyTorch.
"""

import importlib as _importlib
from types import ModuleType as _ModuleType

from . import _workarounds  # noqa: F401  (first: upstream fixes that affect every module)
from . import registry as _registry
from .alibi import ALiBi, alibi_bias, alibi_slopes
from .attend import attention, attention_weights
from .context import CallContext
from .convert import half_to_interleaved, interleaved_to_half, rope_layout_permutation
from .cope import CoPE
from .da_transformer import DAAttention, learnable_sigmoid
from .fire import FIRE
from .flex import PaddedHeadDim, flex_available, supports_flex
from .hf import (
    ROPE_LAYER_FAMILIES,
    ROPE_TYPES,
    LayerPositions,
    rope_from_transformers,
    rope_layers_from_transformers,
    rope_scaling_from_transformers,
)
from .kerple import Kerple
from .kv_cache import KVCache
from .learned import LearnedEmbedding
from .masks import Masks, causal_mask, merge_masks
from .mrope import MultimodalRotaryEmbedding, apply_mrope, mrope_axes, mrope_cos_sin
from .multidim import (
    apply_axial_rope,
    axial_rope_cos_sin,
    axial_sinusoidal_encoding,
    grid_positions,
    sinusoidal_table_2d,
)
from .prope import PartialRotaryEmbedding
from .registry import SCHEMES, scheme_table
from .rope import RotaryEmbedding, apply_rope, rope_cos_sin, rope_frequencies
from .scaling import ROPE_SCALINGS, RopeScaling, ScalingKind
from .scheme import NoPE, PositionalScheme
from .sdpa import dot_scores, repeat_kv, scaled_dot_product, softmax_weights
from .shaw import ShawRelativeAttention, shaw_relative_indices
from .sinusoidal import (
    SinusoidalEmbedding,
    sinusoidal_inv_freq,
    sinusoidal_shift_matrix,
    sinusoidal_table,
)
from .stickbreaking import (
    StickBreakingAttention,
    stickbreaking_attention,
    stickbreaking_weights,
)
from .t5 import T5RelativeBias, t5_relative_bucket
from .temperature import TemperedNoPE, llama4_temperature
from .transformer_xl import (
    TransformerXLAttention,
    TransformerXLScheme,
    rel_shift,
    relative_sinusoids,
)
from .xpos import XPos, xpos_zeta

#: The release, single-sourced: ``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``).
__version__ = "0.1.0"

# The public API, grouped as in the book's reference (book/reference/).  Exactly the
# union of the modules' own ``__all__`` (tests/test_public_api.py checks it): a name
# added to a module's ``__all__`` is added here too, and to the reference and
# CHANGELOG.md.
__all__ = [
    # the attention entry point, masks and the attention math schemes are built from
    "attention",
    "attention_weights",
    "causal_mask",
    "merge_masks",
    "Masks",
    "scaled_dot_product",
    "softmax_weights",
    "dot_scores",
    "repeat_kv",
    "flex_available",
    "supports_flex",
    "PaddedHeadDim",
    # the scheme contract and the registry
    "PositionalScheme",
    "CallContext",
    "SCHEMES",
    "scheme_table",
    # the schemes, one module each
    "NoPE",
    "TemperedNoPE",
    "llama4_temperature",
    "SinusoidalEmbedding",
    "sinusoidal_table",
    "sinusoidal_inv_freq",
    "sinusoidal_shift_matrix",
    "LearnedEmbedding",
    "ALiBi",
    "alibi_slopes",
    "alibi_bias",
    "T5RelativeBias",
    "t5_relative_bucket",
    "ShawRelativeAttention",
    "shaw_relative_indices",
    "TransformerXLAttention",
    "TransformerXLScheme",
    "rel_shift",
    "relative_sinusoids",
    "DAAttention",
    "learnable_sigmoid",
    "XPos",
    "xpos_zeta",
    "Kerple",
    "FIRE",
    "CoPE",
    "StickBreakingAttention",
    "stickbreaking_attention",
    "stickbreaking_weights",
    "ForgettingAttention",
    "ForgetGate",
    "forgetting_attention",
    "PathAttention",
    "PathGate",
    "PathKVCache",
    "path_attention",
    # RoPE, its scalings and checkpoint conversion between its layouts
    "RotaryEmbedding",
    "PartialRotaryEmbedding",
    "apply_rope",
    "rope_cos_sin",
    "rope_frequencies",
    "RopeScaling",
    "ScalingKind",
    "ROPE_SCALINGS",
    "rope_layout_permutation",
    "interleaved_to_half",
    "half_to_interleaved",
    # the decoding cache
    "KVCache",
    # Hugging Face transformers configs
    "rope_from_transformers",
    "rope_layers_from_transformers",
    "LayerPositions",
    "ROPE_LAYER_FAMILIES",
    "rope_scaling_from_transformers",
    "ROPE_TYPES",
    # multi-dimensional positions: grids, axial encodings, multimodal RoPE
    "grid_positions",
    "sinusoidal_table_2d",
    "axial_sinusoidal_encoding",
    "axial_rope_cos_sin",
    "apply_axial_rope",
    "MultimodalRotaryEmbedding",
    "apply_mrope",
    "mrope_axes",
    "mrope_cos_sin",
]

# A scheme added to the registry is exported even before its module is imported above
# (tests/test_public_api.py then asks for its names in __all__ and the reference).
for _module in _registry.modules():
    globals().update({_name: getattr(_module, _name) for _name in _module.__all__})
del _module

_LAZY_SUBMODULES = ("analysis", "viz")


def __getattr__(name: str) -> _ModuleType:
    if name in _LAZY_SUBMODULES:
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the API, not the submodules it is defined in (they stay importable)
    return sorted([*__all__, "__version__", *_LAZY_SUBMODULES])
