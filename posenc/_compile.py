"""How posenc compiles its own kernels (FlexAttention, the fused RoPE), the same on every CPU.

posenc changes no global compiler setting.  Each kernel it compiles lives in a
*region*: one ``torch.compile`` of a fresh copy of the kernel's Python function,
built for one key (a scheme class and a signature, say), so that nothing one
region learns reaches another.  Three rules keep the compiled code right and
the same on any machine and in any order of calls:

* **Explicit dynamism.**  Regions compile with ``dynamic=False`` (no automatic
  dynamic shapes) and their callers mark the sequence lengths dynamic, nothing
  else.  With automatic dynamic shapes, a tensor a score_mod reads (ALiBi's
  slopes, T5's table) becomes symbolic as soon as one compiled function sees
  it at two sizes, which is what running two schemes or two head counts
  through it does; PyTorch 2.13's CPU FlexAttention kernel then fails to build
  (``.ci/upstream/flex_cpu_symbolic_table.py``).  So the result no longer
  depends on what ran before.
* **A fresh code object per region.**  Dynamo keeps its caches, recompile
  counts and profiles per code object; a copy of the function per region
  keeps them per region, on any PyTorch release.
* **The vector ISA in the cache key.**  Inductor's on-disk graph cache does not
  key on the CPU's vector ISA, yet the C++ it stores loops in steps of the
  ISA's lane count: a graph generated under ``ATEN_CPU_CAPABILITY=avx2`` and
  reloaded under AVX-512 runs with mismatched strides and silently wrong
  numbers (``.ci/upstream/inductor_cache_isa.py``).  The ISA's width goes into
  the compile options (``cpp.simdlen``), which are part of the key.

A region holds at most :data:`RECOMPILE_LIMIT` graphs (``fullgraph=True``: past
it Dynamo raises rather than run the kernel uncompiled); a full region is
replaced by a fresh one, so a long sequence of shapes costs compiles, never a
refusal.
"""

from __future__ import annotations

import functools
import inspect
import os
import shutil
import sys
import types
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import torch

__all__: list[str] = []  # private module

_P = ParamSpec("_P")
_R = TypeVar("_R")

# What identifies a region: the kernel's name or scheme class and a signature (dtypes,
# devices, ranks, ...), all hashable (mypy's Hashable protocol refuses classes, so: object).
Key = tuple[object, ...]

# Graphs one region may hold before a fresh region replaces it.
RECOMPILE_LIMIT = 16


@functools.cache
def missing_compiler(device_type: str) -> str | None:
    """Why ``torch.compile`` cannot build kernels for ``device_type``, or ``None`` if it can."""
    if device_type == "cpu":
        cxx = os.environ.get("CXX", "g++")
        if shutil.which(cxx) is None and shutil.which("c++") is None:
            return f"no C++ compiler found ({cxx!r} or 'c++'), which torch.compile needs on a CPU"
        return None
    if device_type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "Triton is not installed, which torch.compile needs on a GPU"
        return None
    return f"posenc compiles kernels for 'cpu' and 'cuda' tensors only, got {device_type!r}"


@functools.cache
def _cpu_vector_width() -> int:
    """The bit width of the vector ISA Inductor compiles CPU code for here (0: none)."""
    from torch._inductor import cpu_vec_isa

    return cpu_vec_isa.pick_vec_isa().bit_width()


def compile_options(device_type: str = "cpu") -> dict[str, Any]:
    """``torch.compile`` keyword arguments for one region (see the module docstring)."""
    opts: dict[str, Any] = {"dynamic": False, "fullgraph": True}
    params = inspect.signature(torch.compile).parameters
    if "isolate_recompiles" in params and "recompile_limit" in params:
        opts.update(isolate_recompiles=True, recompile_limit=RECOMPILE_LIMIT)
    if device_type == "cpu":
        opts["options"] = {"cpp.simdlen": _cpu_vector_width()}
    return opts


def _fresh_copy(fn: Callable[_P, _R], name: str) -> Callable[_P, _R]:
    """``fn`` with a code object of its own, named ``name`` (Dynamo's state is per code object)."""
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"fn must be a Python function, got {type(fn).__name__}")
    code = fn.__code__.replace(co_name=name)
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname=name)
    copy = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


# Each region is a compiled copy of one kernel; the kernels differ in signature.
_regions: dict[Key, Callable[..., Any]] = {}


def region(fn: Callable[_P, _R], key: Key, name: str, device_type: str) -> Callable[_P, _R]:
    """The compiled region of ``fn`` for ``key``, built on first use."""
    compiled = _regions.get(key)
    if compiled is None:
        compiled = torch.compile(_fresh_copy(fn, name), **compile_options(device_type))
        _regions[key] = compiled
    return compiled


def call(
    fn: Callable[_P, _R], key: Key, name: str, device_type: str, *args: _P.args, **kwargs: _P.kwargs
) -> _R:
    """Run ``fn`` compiled in its region for ``key``; a full region is replaced by a fresh one."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    try:
        return region(fn, key, name, device_type)(*args, **kwargs)
    except FailOnRecompileLimitHit:
        del _regions[key]
        return region(fn, key, name, device_type)(*args, **kwargs)


def dynamic_views(*tensors: torch.Tensor, dims: tuple[int, ...]) -> list[torch.Tensor]:
    """Views of ``tensors`` whose dimensions ``dims`` are symbolic and every other static.

    ``dims`` are the sequence dimensions (and for a block mask, its block
    counts); a dimension past a tensor's rank is skipped.  Views, so that the
    caller's tensors carry no compiler marks.  A size of 1 stays static
    (Dynamo specialises sizes 0 and 1), and such a tensor is made contiguous.
    """
    views = []
    for t in tensors:
        symbolic = {d % t.dim() for d in dims if -t.dim() <= d < t.dim()}
        if any(t.shape[d] == 1 for d in symbolic) and not t.is_contiguous():
            # a length of 1 stays static, and so would strides that carry the caller's
            # length (a decoding step's q[:, :, -1:]): one compile per length.  Cheap to copy.
            t = t.contiguous()
        t = t.view(t.shape)
        for d in range(t.dim()):
            if d not in symbolic:
                torch._dynamo.mark_static(t, d)
            elif t.shape[d] > 1:
                torch._dynamo.maybe_mark_dynamic(t, d)
        views.append(t)
    return views
