"""Allocation of large outputs, backed by huge pages where the OS allows it.

A large CPU tensor is usually a fresh ``mmap`` from the C allocator.  The first
write to each 4 KiB page then traps into the kernel, which zeroes the page.
On virtual machines the trap, not the zeroing, dominates: here a new 64 MiB
output cost twice as much to fault in as to compute (``x * 2`` takes 3x a
copy into a preallocated tensor).

For outputs of at least :data:`MIN_BYTES` we ask the kernel, before anything
is written, to back the 2 MiB-aligned interior with transparent huge pages
(``madvise(MADV_HUGEPAGE)``): one trap per 2 MiB instead of per 4 KiB.  This
is what PyTorch itself does for every allocation when started with
``THP_MEM_ALLOC_ENABLE=1``; we apply it only to the large outputs posenc
writes.  The advice is only a hint: on other platforms, on GPUs, with THP
disabled or if the call fails, :func:`empty` is plain :func:`torch.empty`.
Values are never affected.  Under ``torch.compile``/``torch.export`` tracing
and for fake or meta tensors there is no memory to advise, so :func:`empty`
is plain :func:`torch.empty` there too (``benchmarks/bench_rope.py`` measures
what the advice saves).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable

import torch

from ._runtime import tracing
from ._types import Device

__all__: list[str] = []  # private module

# glibc's largest dynamic mmap threshold: allocations this big are always fresh
# mappings.  Smaller ones are often recycled, already faulted-in heap memory,
# where the advice only costs a system call and splits the heap mapping.
MIN_BYTES = 32 << 20
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # linux/mman.h


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise``, or ``None`` where transparent huge pages do not exist."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """Hint that the untouched CPU tensor ``t`` be backed by huge pages; return ``t``."""
    if t.device.type != "cpu":
        return t
    nbytes = t.untyped_storage().nbytes()
    if nbytes < MIN_BYTES:
        return t
    madvise = _madvise()
    if madvise is None:
        return t
    ptr = t.untyped_storage().data_ptr()
    start = -(-ptr // _HUGE_PAGE) * _HUGE_PAGE
    end = (ptr + nbytes) // _HUGE_PAGE * _HUGE_PAGE
    if end > start:
        madvise(start, end - start, _MADV_HUGEPAGE)  # a hint: failure changes nothing
    return t


def empty(*shape: int, dtype: torch.dtype, device: Device = None) -> torch.Tensor:
    """``torch.empty(shape)`` for an output about to be written in full.

    Large CPU outputs get the huge-page hint (see the module docstring); traced,
    fake and meta tensors do not.
    """
    t = torch.empty(*shape, dtype=dtype, device=device)
    if tracing() or type(t) is not torch.Tensor or t.device.type != "cpu":
        return t
    return advise_huge_pages(t)


def peak_tensor_mib(fn: Callable[[], object]) -> float:
    """Peak tensor memory (MiB) allocated and held while ``fn()`` runs, from torch.profiler.

    Used by the memory-bound tests and the benchmarks: it counts bytes requested,
    not time, so it is stable on a busy machine.
    """
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        fn()
    deltas = []
    for e in prof.events():
        if e.name == "[memory]":  # allocations and frees outside any op
            deltas.append((e.time_range.start, e.cpu_memory_usage))
        elif e.self_cpu_memory_usage > 0:  # what an op allocated (net of its own frees)
            deltas.append((e.time_range.start, e.self_cpu_memory_usage))
    held = peak = 0
    for _, d in sorted(deltas, key=lambda t: t[0]):
        held += d
        peak = max(peak, held)
    return peak / 2**20
