"""Eager cost of the attention mechanisms added since 2024, against SDPA and a read+write.

Issue 36 item 4 asks each new mechanism to state its cost.  At ``(1, 8, L, 64)``
float32, causal, for ``L`` in 512 and 2048, every candidate runs side by side in
one process, interleaved within each repeat (the same machine load for all), and
the medians are printed and stored with two ratios measured in the same run:

* to SDPA with ``is_causal=True``, no mask and no bias (the fastest attention
  PyTorch has here);
* to a read+write of the same bytes: ``torch.addcmul(q, k, v)`` reads ``q``,
  ``k`` and ``v`` once and writes one tensor of the output's size, the memory
  traffic attention cannot go below.

Extra memory is the peak of tensor memory a call allocates and holds beyond its
output (``torch.profiler``'s allocation records, ``posenc._memory.peak_tensor_mib``,
as ``benchmarks/bench_fused.py``), with the process's peak RSS growth beside it.

Candidates (one entry of :data:`CANDIDATES` each; add a mechanism there):

* ``stickbreaking``: :func:`posenc.stickbreaking_attention`, eager, in log space:
  several ``(batch, heads, L, L)`` float32 tensors (logits, both log-sigmoids, the
  reverse cumulative sum, the weights), so O(L^2) memory.
* ``path`` and ``path_fox``: :func:`posenc.path_attention` (PaTH, and PaTH-FoX with
  a forget gate), eager: chunks of 64 tokens, a triangular solve per chunk, the
  queries carried across whole chunks as 64 x 64 products; the scores and the
  weights are ``(batch, heads, L, L)``, so O(L^2) memory.  ``w`` (unit), ``beta``
  (in (0, 2)) and ``log f`` have one head per query head and are drawn once per
  shape, outside the timing.

The results, with the CPU, cores, threads, torch version and load average, go
to ``benchmarks/results/since2024_eager.json``.  Run: ``python
benchmarks/bench_since2024.py [--repeats N] [--threads T] [--lengths 512 2048]``.
A measurement script, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import posenc

try:  # same directory: the timing loop, memory measures and machine record of bench_fused
    from bench_fused import machine, memory, run_side_by_side
except ImportError:  # run from elsewhere
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_fused import machine, memory, run_side_by_side

BATCH, HEADS, HEAD_DIM = 1, 8, 64
RESULTS = Path(__file__).resolve().parent / "results" / "since2024_eager.json"


def stickbreaking(q, k, v):
    return posenc.stickbreaking_attention(q, k, v)


_PATH: dict[torch.Size, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _path_inputs(q):
    """PaTH's w, beta and log f for q's shape, drawn on the first (warm-up) call only."""
    if q.shape not in _PATH:
        g = torch.Generator().manual_seed(1)
        b, h, n, d = q.shape
        w = F.normalize(torch.randn(b, h, n, d, generator=g), dim=-1)
        beta = 2 * torch.sigmoid(torch.randn(b, h, n, generator=g))
        log_f = F.logsigmoid(3 + torch.randn(b, h, n, generator=g))
        _PATH[q.shape] = (w, beta, log_f)
    return _PATH[q.shape]


def path(q, k, v):
    w, beta, _ = _path_inputs(q)
    return posenc.path_attention(q, k, v, w, beta)


def path_fox(q, k, v):
    w, beta, log_f = _path_inputs(q)
    return posenc.path_attention(q, k, v, w, beta, log_f=log_f)


#: name -> f(q, k, v) for (batch, heads, L, d) float32 inputs, causal.
CANDIDATES = {
    "stickbreaking": stickbreaking,
    "path": path,
    "path_fox": path_fox,
}

BASELINES = {
    "sdpa_is_causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "read_write": lambda q, k, v: torch.addcmul(q, k, v),
}


def measure(length: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(BATCH, HEADS, length, HEAD_DIM, generator=g) for _ in range(3))
    everything = {**BASELINES, **CANDIDATES}
    with torch.no_grad():
        fns = {name: (lambda f=f: f(q, k, v)) for name, f in everything.items()}
        _, medians = run_side_by_side(fns, repeats)
        out_bytes = q.numel() * q.element_size()
        rows = {}
        for name, fn in fns.items():
            extra, rss = memory(fn, out_bytes)
            rows[name] = {
                "median_ms": round(1e3 * medians[name], 3),
                "ratio_to_sdpa": round(medians[name] / medians["sdpa_is_causal"], 2),
                "ratio_to_read_write": round(medians[name] / medians["read_write"], 2),
                "extra_mib": round(extra, 1),
                "rss_growth_mib": None if rss is None else round(rss, 1),
            }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = {
        "machine": machine(),
        "shape": f"({BATCH}, {HEADS}, L, {HEAD_DIM}) float32, causal",
        "repeats": args.repeats,
        "read_write": "torch.addcmul(q, k, v): reads q, k, v, writes one output",
        "lengths": {},
    }
    for length in args.lengths:
        rows = measure(length, args.repeats)
        result["lengths"][str(length)] = rows
        print(f"L = {length}")
        print(f"  {'':16} {'median ms':>10} {'/ SDPA':>8} {'/ r+w':>8} {'extra MiB':>10}")
        for name, row in rows.items():
            print(
                f"  {name:16} {row['median_ms']:10.2f} {row['ratio_to_sdpa']:8.2f} "
                f"{row['ratio_to_read_write']:8.2f} {row['extra_mib']:10.1f}"
            )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
