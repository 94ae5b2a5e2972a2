"""Tests for posenc._memory: large outputs get the huge-page hint; values never change."""

import os
import sys

import pytest
import torch

import posenc
from posenc import _memory

linux_only = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and os.path.isdir("/sys/kernel/mm/transparent_hugepage")),
    reason="needs Linux with transparent huge pages",
)


def vm_flags_at(address: int) -> set[str]:
    """The kernel's VmFlags for the mapping that holds ``address`` (from /proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


@linux_only
def test_large_cpu_output_is_advised_before_it_is_touched():
    if _memory._madvise() is None:
        pytest.skip("libc has no madvise")
    t = _memory.empty((_memory.MIN_BYTES + (4 << 20)) // 4, dtype=torch.float32)
    middle = t.data_ptr() + t.numel() * t.element_size() // 2
    assert "hg" in vm_flags_at(middle)  # VM_HUGEPAGE: madvise(MADV_HUGEPAGE) took effect


@linux_only
def test_small_output_is_left_alone():
    t = _memory.empty(1024, dtype=torch.float32)
    assert "hg" not in vm_flags_at(t.data_ptr())


def test_empty_matches_torch_empty():
    t = _memory.empty(3, 5, dtype=torch.float64, device="cpu")
    assert t.shape == (3, 5) and t.dtype == torch.float64 and t.device.type == "cpu"


def test_advice_never_changes_values():
    # (1, 16, 4096, 128) float32 is 32 MiB: apply_rope allocates it with the advice
    x = torch.randn(1, 16, 4096, 128)
    assert x.numel() * 4 >= _memory.MIN_BYTES
    advised = posenc.apply_rope(x)
    plain = posenc.apply_rope(x, out=torch.empty_like(x))
    assert torch.equal(advised, plain)


def test_non_cpu_and_small_tensors_are_returned_unchanged():
    t = torch.empty(10)
    assert _memory.advise_huge_pages(t) is t
    m = torch.empty(_memory.MIN_BYTES, dtype=torch.uint8, device="meta")
    assert _memory.advise_huge_pages(m) is m


def test_plain_empty_under_tracing_and_for_fake_or_meta_tensors(monkeypatch):
    calls = []
    monkeypatch.setattr(_memory, "advise_huge_pages", lambda t: calls.append(t) or t)
    n = _memory.MIN_BYTES // 4 + 1
    m = _memory.empty(n, dtype=torch.float32, device="meta")
    assert m.device.type == "meta" and calls == []
    with torch._subclasses.FakeTensorMode():
        f = _memory.empty(n, dtype=torch.float32)
    assert isinstance(f, torch._subclasses.FakeTensor) and calls == []
    torch._dynamo.reset()
    traced = torch.compile(
        lambda x: _memory.empty(*x.shape, dtype=x.dtype).copy_(x), fullgraph=True, backend="eager"
    )
    x = torch.randn(3)
    assert torch.equal(traced(x), x) and calls == []  # no ctypes call inside the graph
    _memory.empty(n, dtype=torch.float32)
    assert len(calls) == 1  # eager CPU: advised
