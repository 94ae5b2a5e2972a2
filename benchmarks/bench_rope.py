"""Benchmark posenc.apply_rope against a memory-bound floor and the transformers formula.

Prints, per shape and dtype, the median time of each candidate and two ratios:

* ``/ copy``: against ``torch.mul(x, 2, out=y)``, one read and one write of
  the same tensor (the floor for any out-of-place elementwise op);
* ``/ same-alloc copy``: candidates that allocate their output are also
  compared with ``x * 2``, which allocates too.  On machines where first-touch
  page faults are expensive, allocating a fresh 64 MiB output costs more than
  the arithmetic, whatever the operation; ``out=`` avoids it;
* ``copy allocating, huge pages``: ``x * 2`` into an output from
  ``posenc._memory.empty``, which asks the kernel for transparent huge pages
  before the first write.  Set beside ``x * 2`` it shows what that advice saves
  (it stays in posenc only because this line shows it pays);
* ``formula / apply_rope``: the speed-up over the formula most RoPE code uses,
  ``x * cos + rotate_half(x) * sin`` (half layout, cos/sin precomputed and
  expanded to the full feature width, as in transformers' LLaMA).

Candidates are interleaved within each repeat so that they see the same machine
load; the medians are over repeats.  Run: ``python benchmarks/bench_rope.py``.
This is a measurement script, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import posenc
from posenc import _memory


def rotate_half_transformers(x):
    """The half-layout partner: ``(-x2, x1)`` for ``x = (x1, x2)``."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def candidates(x):
    seq, dim = x.shape[-2:]
    y = torch.empty_like(x)
    out = torch.empty_like(x)
    # the transformers recipe: float32 tables duplicated to width dim, cast to x's dtype
    cos, sin = posenc.rope_cos_sin(range(seq), dim)
    cos = torch.cat((cos, cos), dim=-1).to(x.dtype)
    sin = torch.cat((sin, sin), dim=-1).to(x.dtype)
    return {
        "copy (read+write)": lambda: torch.mul(x, 2, out=y),
        "copy allocating (x * 2)": lambda: x * 2,
        "copy allocating, huge pages": lambda: torch.mul(
            x, 2, out=_memory.empty(*x.shape, dtype=x.dtype)
        ),
        "apply_rope interleaved": lambda: posenc.apply_rope(x),
        "apply_rope interleaved out=": lambda: posenc.apply_rope(x, out=out),
        "apply_rope half": lambda: posenc.apply_rope(x, layout="half"),
        "apply_rope half out=": lambda: posenc.apply_rope(x, layout="half", out=out),
        "transformers formula": lambda: x * cos + rotate_half_transformers(x) * sin,
    }


def bench(shape, dtype, repeats):
    x = torch.randn(shape, dtype=dtype)
    fns = candidates(x)
    times = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    floor = med["copy (read+write)"]
    floor_alloc = med["copy allocating (x * 2)"]
    formula = med["transformers formula"]
    print(f"\nshape {tuple(shape)} {str(dtype).removeprefix('torch.')}, {repeats} repeats")
    print(f"  {'candidate':30s} {'median ms':>10s} {'/ copy':>8s} {'/ same-alloc copy':>18s}")
    for name, t in med.items():
        same = floor if ("out=" in name or name.startswith("copy (")) else floor_alloc
        if name == "copy allocating, huge pages":
            same = floor_alloc  # below 1: the advice pays
        speedup = f"   {formula / t:5.2f}x faster than the formula" if "apply_rope" in name else ""
        print(f"  {name:30s} {1e3 * t:10.2f} {t / floor:8.2f} {t / same:18.2f}{speedup}")
    return med


# Targets for eager apply_rope: at most this many times the read+write, and at
# least 2x faster than the transformers formula.
TARGETS = {torch.float32: 3.0, torch.bfloat16: 5.0}


def verdicts(med, dtype):
    """One line per apply_rope candidate: does it meet the targets for ``dtype``?"""
    floor, formula = med["copy (read+write)"], med["transformers formula"]
    for name, t in med.items():
        if name.startswith("apply_rope"):
            ok = t / floor <= TARGETS[dtype] and formula / t >= 2.0
            print(f"  {name:30s} {'meets' if ok else 'MISSES'} the targets")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for shape, dtype in [((1, 32, 4096, 128), torch.float32), ((8, 16, 1024, 64), torch.bfloat16)]:
        med = bench(shape, dtype, args.repeats)
        verdicts(med, dtype)
    print(
        "\ntargets: apply_rope <= 3x copy in float32, <= 5x copy in bfloat16, "
        "and >= 2x faster than the transformers formula"
    )


if __name__ == "__main__":
    main()
