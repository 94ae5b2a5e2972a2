"""Cost of building the sinusoidal table, against an allocate-and-fill of the same size.

The target: ``sinusoidal_table(n, d)`` costs at most 1.5x ``torch.empty(n, d).fill_(1.0)``,
the least any table builder must do (allocate the memory and write every entry once).
Both are timed in alternation, repeat after repeat, so machine noise (other
processes, frequency changes) hits them alike; we print medians and their ratio.
Also shown: the usual float32 recipe (positions times frequencies in float32, then
sin/cos), which is both slower and wrong by ~0.07 at p = 10**6, float64 sin/cos, and
the floor of the angle-addition method itself: its one combining pass (a complex
multiply of the two precomputed ~sqrt(n)-row factor tables into a new output), without
the factor tables' float64 sin/cos and the argument checks.  Last, ``no huge pages``:
the interleaved table with posenc's transparent-huge-page advice for outputs of 32 MiB
or more switched off (``posenc/_memory.py``), to show what the advice buys; below
32 MiB the two are the same code.

Run: ``python benchmarks/bench_sinusoidal.py [--repeats N] [--threads T]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

import posenc
from posenc import _memory

SIZES = [(10**6, 64), (8192, 512), (2048, 1024), (4096, 128), (512, 64)]


def fill(n, d):
    return torch.empty(n, d).fill_(1.0)


def usual_fp32(n, d):
    # the recipe found in most codebases: angles formed in float32
    p = torch.arange(n, dtype=torch.float32)[:, None]
    w = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-torch.log(torch.tensor(1e4)) / d))
    out = torch.empty(n, d)
    out[:, 0::2] = torch.sin(p * w)
    out[:, 1::2] = torch.cos(p * w)
    return out


def float64_sincos(n, d):
    ang = torch.arange(n, dtype=torch.float64)[:, None] * posenc.sinusoidal_inv_freq(d)
    out = torch.empty(n, d)
    out[:, 0::2] = ang.sin()
    out[:, 1::2] = ang.cos()
    return out


def combine_only(n, d):
    """The combining pass alone: factor tables prepared outside the timed call."""
    block = math.isqrt(n - 1) + 1
    a = torch.randn(-(-n // block), 1, d // 2, dtype=torch.complex64)
    b = torch.randn(block, d // 2, dtype=torch.complex64)
    return lambda n, d: torch.mul(a, b)


def without_huge_pages(n, d):
    advise = _memory.advise_huge_pages
    _memory.advise_huge_pages = lambda t: t
    try:
        return posenc.sinusoidal_table(n, d)
    finally:
        _memory.advise_huge_pages = advise


def timed(fn, *args):
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.repeats} repeats")

    candidates = {
        "interleaved": lambda n, d: posenc.sinusoidal_table(n, d),
        "half": lambda n, d: posenc.sinusoidal_table(n, d, layout="half"),
        "usual fp32": usual_fp32,
        "fp64 sin/cos": float64_sincos,
        "combine only": None,  # per size, below
        "no huge pages": without_huge_pages,
    }
    header = f"{'size':>14} {'fill ms':>9}" + "".join(f" {k:>22}" for k in candidates)
    print(header)
    worst = 0.0
    for n, d in SIZES:
        fns = {**candidates, "combine only": combine_only(n, d)}
        times = {k: [] for k in ["fill", *fns]}
        for fn in [fill, *fns.values()]:
            fn(n, d)  # warm up
        for _ in range(args.repeats):
            times["fill"].append(timed(fill, n, d))
            for k, fn in fns.items():
                times[k].append(timed(fn, n, d))
        med = {k: statistics.median(v) for k, v in times.items()}
        cells = []
        for k in candidates:
            ratio = med[k] / med["fill"]
            cells.append(f"{med[k] * 1e3:9.2f} ms ({ratio:5.2f}x)")
            if k in ("interleaved", "half"):
                worst = max(worst, ratio)
        print(f"{f'({n}, {d})':>14} {med['fill'] * 1e3:9.2f}" + "".join(f" {c:>22}" for c in cells))
    verdict = "meets" if worst <= 1.5 else "MISSES"
    print(f"worst table/fill ratio: {worst:.2f}x ({verdict} the 1.5x target)")


if __name__ == "__main__":
    main()
