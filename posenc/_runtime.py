"""One answer to "may this code read tensor values or take an eager fast path right now?".

posenc has eager fast paths (host reads such as ``.item()``, cached tables,
in-place writes, data pointers, kernels it compiles itself) and plain
differentiable forms that trace everywhere.  Which one runs depends on the
runtime, and every module asks here:

* :func:`tracing`: ``torch.compile``/``torch.export``/``torch.jit.trace`` is
  building a graph, so a host read would break it.
* :func:`symbolic`: ``t`` has no storage (meta or fake tensor).
* :func:`in_transform`: ``t`` is wrapped by a functorch transform (``vmap``,
  ``grad``, ``jvp``) or carries a forward-mode AD tangent.
* :func:`has_values`: ``t``'s values can be read on the host (not tracing, not
  symbolic, not inside a functorch transform).
* :func:`eager_ok`: the eager fast paths may touch ``t``: it has values, is a
  plain tensor (or parameter) and carries no forward-mode tangent.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD

__all__: list[str] = []  # private module


def tracing() -> bool:
    """Whether a graph is being traced (torch.compile, torch.export, torch.jit.trace)."""
    # torch.jit re-exports is_tracing without listing it in __all__
    jit_tracing: bool = torch.jit.is_tracing()  # type: ignore[attr-defined,no-untyped-call]
    return torch.compiler.is_compiling() or torch.compiler.is_exporting() or jit_tracing


def symbolic(t: torch.Tensor) -> bool:
    """Whether ``t`` has no data: a meta or fake tensor."""
    return t.device.type == "meta" or isinstance(t, torch._subclasses.FakeTensor)


def _dual(t: torch.Tensor) -> bool:
    return fwAD._current_level >= 0 and fwAD.unpack_dual(t).tangent is not None


def in_transform(t: torch.Tensor) -> bool:
    """Whether ``t`` is inside ``vmap``/``grad``/``jvp`` or carries a forward-mode tangent."""
    return torch._C._functorch.is_functorch_wrapped_tensor(t) or _dual(t)


def has_values(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can be read on the host right now.

    False while tracing, for meta or fake tensors and inside functorch
    transforms: checks that read values step aside there instead of breaking
    the graph.
    """
    if tracing() or symbolic(t):
        return False
    return not torch._C._functorch.is_functorch_wrapped_tensor(t)


def eager_ok(t: torch.Tensor) -> bool:
    """Whether eager fast paths (in-place writes, host reads, data pointers) may touch ``t``."""
    return has_values(t) and type(t) in (torch.Tensor, torch.nn.Parameter) and not _dual(t)
