"""Time posenc.attention with every scheme, side by side, and print medians and ratios.

Run: python benchmarks/bench_attention.py [--n 1024] [--device cpu]
Ratios are relative to no positional encoding, measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import posenc


def median_seconds(fn, repeats: int, sync) -> float:
    fn()  # warm up (kernels, caches)
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    dev, h, d, n = args.device, args.heads, args.head_dim, args.n
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    q, k, v = (torch.randn(1, h, n, d, device=dev) for _ in range(3))
    schemes = {
        "none": None,
        "RoPE": posenc.RotaryEmbedding(d),
        "ALiBi": posenc.ALiBi(h),
        "T5": posenc.T5RelativeBias(h),
        "Shaw": posenc.ShawRelativeAttention(d, 16),
        "Transformer-XL": posenc.TransformerXLScheme(h, d),
        "DA": posenc.DAAttention(h, w_init=-0.1, v_init=0.5),
    }
    print(f"n={n} heads={h} head_dim={d} device={dev} causal=True, median of {args.repeats}")
    base = None
    with torch.no_grad():
        for name, scheme in schemes.items():
            if isinstance(scheme, torch.nn.Module):
                scheme = scheme.to(dev)
            t = median_seconds(
                lambda s=scheme: posenc.attention(q, k, v, encoding=s, causal=True),
                args.repeats,
                sync,
            )
            base = t if base is None else base
            print(f"{name:>15s}  {t * 1e3:9.2f} ms  x{t / base:6.2f}")


if __name__ == "__main__":
    main()
