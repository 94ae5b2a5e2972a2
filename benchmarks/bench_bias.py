"""Side-by-side timings for the materialised-bias schemes (ALiBi, T5, Shaw) on this machine.

Prints medians and ratios; nothing here is asserted.  Shaw is compared with
the naive form that builds the (q_len, k_len, head_dim) relative tensors,
which Sec. 3.3 of Shaw et al. (2018) avoids.  On a CPU the two run at about
the same speed; the gain of the Sec. 3.3 form is memory (no O(n^2 d) tensor).

    python benchmarks/bench_bias.py
"""

import statistics
import time

import torch

import posenc


def median_ms(fn, args, repeat=15, **kwargs):
    fn(*args, **kwargs)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def naive_shaw(m, q, k, v):
    labels = posenc.shaw_relative_indices(q.shape[-2], k.shape[-2], m.max_distance)
    a_k, a_v = m.key_embeddings[labels], m.value_embeddings[labels]  # (Lq, Lk, d) each
    scores = (q @ k.transpose(-2, -1) + torch.einsum("...id,ijd->...ij", q, a_k)) * q.shape[
        -1
    ] ** -0.5
    alpha = scores.softmax(-1)
    return alpha @ v + torch.einsum("...ij,ijd->...id", alpha, a_v)


def main():
    torch.manual_seed(0)
    batch, heads, d = 2, 8, 64
    alibi, t5 = posenc.ALiBi(heads), posenc.T5RelativeBias(heads)
    shaw = posenc.ShawRelativeAttention(d, 16)
    print(f"{'n':>6} {'none ms':>9} {'ALiBi x':>8} {'T5 x':>6} {'Shaw ms':>8} {'naive/Shaw':>11}")
    with torch.no_grad():
        for n in (256, 512, 1024):
            q, k, v = (torch.randn(batch, heads, n, d) for _ in range(3))
            qkv = (q, k, v)
            base = median_ms(posenc.attention, qkv, causal=True)
            t_alibi = median_ms(posenc.attention, qkv, encoding=alibi, causal=True)
            t_t5 = median_ms(posenc.attention, qkv, encoding=t5, causal=True)
            t_shaw = median_ms(posenc.attention, qkv, encoding=shaw)
            t_naive = median_ms(naive_shaw, (shaw, q, k, v))
            print(
                f"{n:6d} {base:9.2f} {t_alibi / base:8.2f} {t_t5 / base:6.2f} "
                f"{t_shaw:8.2f} {t_naive / t_shaw:11.2f}"
            )


if __name__ == "__main__":
    main()
