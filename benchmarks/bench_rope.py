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
import json
import os
import statistics
import sys
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


def _layouts(x, y):
    return {
        "copy": lambda: torch.mul(x, 2, out=y),
        "half_eager": lambda: posenc.apply_rope(x, layout="half"),
        "half_compiled": lambda: posenc.apply_rope(x, layout="half", compiled=True),
        "interleaved_eager": lambda: posenc.apply_rope(x),
        "interleaved_compiled": lambda: posenc.apply_rope(x, compiled=True),
    }


def many_shapes(dtype, lengths, repeats):
    """``compiled=True`` against eager over many lengths at (1, 32, S, 128), both layouts.

    Each length arrives once; its first compiled call is timed apart (a
    compile, or a guard check) with the graphs Dynamo compiled during it,
    then the candidates run interleaved.  The ratios are to the eager path of
    the same layout and to a read+write of the same bytes
    (``torch.mul(x, 2, out=y)``).  The interleaved layout runs the same eager
    kernel with ``compiled=True``: its compiled / eager ratio is a null
    control, whose scatter is what the load alone does to a ratio.
    """
    compiled_during = _bench_fused().compiled_during
    rows = []
    name = str(dtype).removeprefix("torch.")
    print(f"\nmany shapes: RoPE (1, 32, S, 128) {name}, {len(lengths)} lengths, {repeats} repeats")
    print(f"  {'S':>5s} {'copy ms':>8s} " + " ".join(f"{c:>17s}" for c in (
        "half eager", "half compiled", "inter. eager", "inter. compiled")))  # fmt: skip
    for seq in lengths:
        x = torch.randn(1, 32, seq, 128, dtype=dtype)
        fns = _layouts(x, torch.empty_like(x))
        first, graphs = {}, {}
        for key, fn in fns.items():
            first[key], compiled = compiled_during(fn)
            graphs[key] = compiled["graphs"]
        times = {key: [] for key in fns}
        for _ in range(repeats):
            for key, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - t0)
        med = {key: statistics.median(ts) for key, ts in times.items()}
        best = {key: min(ts) for key, ts in times.items()}  # least disturbed by other load
        rows.append({"seq": seq, **{f"{k}_s": t for k, t in med.items()},
                     **{f"{k}_min_s": t for k, t in best.items()},
                     **{f"{k}_first_call_s": t for k, t in first.items()},
                     **{f"{k}_first_call_graphs": n for k, n in graphs.items()}})  # fmt: skip
        cells = " ".join(
            f"{1e3 * med[k]:7.2f} ({med[k] / med['copy']:4.2f}x)" for k in list(fns)[1:]
        )
        print(f"  {seq:5d} {1e3 * med['copy']:8.2f} {cells}")
    last = rows[len(rows) // 2 :]
    summary = {
        lay: statistics.median(r[f"{lay}_compiled_s"] / r[f"{lay}_eager_s"] for r in last)
        for lay in ("half", "interleaved")
    }
    summary_min = {
        lay: statistics.median(r[f"{lay}_compiled_min_s"] / r[f"{lay}_eager_min_s"] for r in last)
        for lay in ("half", "interleaved")
    }
    for lay, ratio in summary.items():
        ok = "meets " if ratio <= 1.0 else "MISSES"
        if lay == "interleaved":  # compiled=True runs the eager kernel: no verdict on noise
            ok = "same kernel, "
        print(f"  {ok} {lay} compiled / eager, last half of the lengths: {ratio:.2f}x of medians, "
              f"{summary_min[lay]:.2f}x of minima (target <= 1.0x)")  # fmt: skip
    print(f"  first compile (half): {rows[0]['half_compiled_first_call_s']:.2f} s; later lengths' "
          f"first calls {min(r['half_compiled_first_call_s'] for r in rows[1:]):.3f}-"
          f"{max(r['half_compiled_first_call_s'] for r in rows[1:]):.3f} s")  # fmt: skip
    control = [r["interleaved_compiled_s"] / r["interleaved_eager_s"] for r in rows]
    print(f"  null control (interleaved, the same kernel both sides): compiled / eager from "
          f"{min(control):.2f}x to {max(control):.2f}x over the {len(rows)} lengths")  # fmt: skip
    print(f"  graphs Dynamo compiled by the first half-layout call at each length: "
          f"{[r['half_compiled_first_call_graphs'] for r in rows]}")  # fmt: skip
    return {"dtype": name, "rows": rows, "compiled_over_eager_last_half": summary,
            "compiled_over_eager_last_half_of_minima": summary_min}  # fmt: skip


def _bench_fused():
    """``bench_fused`` beside this script (machine description, compile counts)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_fused

    return bench_fused


def machine():
    return _bench_fused().machine()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--many-shapes-only", action="store_true", help="only the 12-length run")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    start = machine()
    lengths = [1024 + 256 * i for i in range(12)]
    runs = [many_shapes(dt, lengths, max(3, args.repeats // 3))
            for dt in (torch.float32, torch.bfloat16)]  # fmt: skip
    result = {
        "benchmark": "bench_rope.py many shapes",
        "workload": "posenc.apply_rope on (1, 32, S, 128), 12 lengths, no grad",
        "machine": start,
        "load_average_at_end": [round(v, 2) for v in os.getloadavg()],
        "runs": runs,
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "rope_many_shapes.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("  written to benchmarks/results/rope_many_shapes.json")
    if args.many_shapes_only:
        return
    for shape, dtype in [((1, 32, 4096, 128), torch.float32), ((8, 16, 1024, 64), torch.bfloat16)]:
        med = bench(shape, dtype, args.repeats)
        verdicts(med, dtype)
    print(
        "\ntargets: apply_rope <= 3x copy in float32, <= 5x copy in bfloat16, "
        "and >= 2x faster than the transformers formula"
    )


if __name__ == "__main__":
    main()
