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
``multidim``           grid positions: the 2-D (N-D) sin-cos table of ViT/MAE/DETR
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

import importlib

from . import _workarounds  # noqa: F401  (first: upstream fixes that affect every module)
from . import registry as _registry
from .attend import *  # noqa: F403
from .context import *  # noqa: F403
from .convert import *  # noqa: F403
from .flex import *  # noqa: F403
from .hf import *  # noqa: F403
from .kv_cache import *  # noqa: F403
from .masks import *  # noqa: F403
from .mrope import *  # noqa: F403
from .multidim import *  # noqa: F403
from .registry import *  # noqa: F403
from .scaling import *  # noqa: F403
from .scheme import *  # noqa: F403
from .sdpa import *  # noqa: F403

# Names that lived in posenc.scheme before issue 20 split it (contract / attend / sdpa /
# masks) stay importable from there; attached here, since scheme.py cannot import attend
# (attend imports scheme)
for _name in (
    "attention", "attention_weights", "causal_mask", "dot_scores", "merge_masks", "repeat_kv",
    "scaled_dot_product", "softmax_weights",
):  # fmt: skip
    setattr(globals()["scheme"], _name, globals()[_name])
del _name

# every registered scheme's module exports its public names: one registry line suffices
for _module in _registry.modules():
    globals().update({_name: getattr(_module, _name) for _name in _module.__all__})
del _module

__version__ = "0.1.0"

_LAZY_SUBMODULES = ("analysis", "viz")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")
