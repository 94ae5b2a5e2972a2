"""posenc: positional encodings for transformers, exact and fast.

Every public name is re-exported here from the module that owns it:

=====================  ======================================================
module                 what lives there
=====================  ======================================================
``scheme``             :func:`attention`, the one entry point, the
                       :class:`PositionalScheme` contract every scheme follows,
                       and the mask merging every path shares
``sinusoidal``         the fixed sinusoidal table of Vaswani et al. (2017)
``learned``            learned absolute position tables
``rope``               rotary embeddings (RoFormer): frequencies, cos/sin
                       tables, ``apply_rope``, the cached module
``flex``               fused attention through FlexAttention for ALiBi, T5 and
                       other score_mod schemes: no O(n^2) bias (``backend=``)
``kv_cache``           a decoding cache whose keys are rotated once (``KVCache``)
``scaling``            RoPE context-extension scalings (PI, NTK, YaRN, Llama 3.1)
``convert``            checkpoint conversion between RoPE layouts
``multidim``           grid positions: the 2-D (N-D) sin-cos table of ViT/MAE/DETR
                       and axial RoPE for image patches (Heo et al., 2024)
``alibi``              ALiBi slopes and biases (Press et al., 2022)
``t5``                 T5 relative-position buckets (Raffel et al., 2020)
``shaw``               relative position representations (Shaw et al., 2018)
``transformer_xl``     relative attention with memory (Dai et al., 2019)
``da_transformer``     distance-aware attention (Wu et al., 2021)
``analysis``           helpers for the book's derivations (needs SciPy)
``viz``                plot helpers shared by chapters (needs Matplotlib)
=====================  ======================================================

``analysis`` and ``viz`` load on first use, so ``import posenc`` needs only
PyTorch.
"""

import importlib

from . import _workarounds  # noqa: F401  (first: upstream fixes that affect every module)
from .alibi import *  # noqa: F403
from .convert import *  # noqa: F403
from .da_transformer import *  # noqa: F403
from .flex import *  # noqa: F403
from .kv_cache import *  # noqa: F403
from .learned import *  # noqa: F403
from .multidim import *  # noqa: F403
from .rope import *  # noqa: F403
from .scaling import *  # noqa: F403
from .scheme import *  # noqa: F403
from .shaw import *  # noqa: F403
from .sinusoidal import *  # noqa: F403
from .t5 import *  # noqa: F403
from .transformer_xl import *  # noqa: F403

__version__ = "0.1.0"

_LAZY_SUBMODULES = ("analysis", "viz")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")
