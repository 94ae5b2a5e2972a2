"""Per-step decoding cost with RoPE: re-rotating the whole cache vs rotating each key once.

Two strategies for one decoding step (one new token, grouped-query heads), at cache
lengths of 1k, 4k and 16k keys:

* ``re-rotate``: the cache holds keys as projected (``posenc.KVCache(None)``) and
  every step runs ``posenc.attention(q, keys, values, encoding=rope, causal=True)``,
  which rotates all cached keys again;
* ``rotate-once``: ``posenc.KVCache(rope)`` rotates the new query and key once at
  their position, caches the key rotated, and the step attends with no encoding.

Both include appending the new key/value to a preallocated cache and the attention
itself.  The strategies alternate within each repeat so that they see the same machine
load; medians over repeats are printed side by side with their ratio.  The cache grows
by one key per repeat (1k becomes 1k + repeats), which does not change the picture.

Memory, two measures of one call, in MiB:

* ``torch peak``: the peak of tensor memory that the call allocates and still holds,
  from ``torch.profiler``'s allocation records (``profile_memory=True``): each op's
  own allocations count from its start, frees from when they happen.  It sees every
  tensor the call creates, including memory that the allocator recycles, but not a
  temporary that one op both allocates and frees inside itself;
* ``RSS``: the peak growth of the process's resident set (Linux: ``VmHWM`` after
  resetting it through ``/proc/self/clear_refs``, minus ``VmRSS`` before).  It counts
  only memory the call newly touches: large temporaries are fresh mappings and show up
  in full, small ones recycled from the allocator's free lists do not.  "n/a" where the
  kernel does not offer it.

Last, one step at position 3,000,000, where a table over every position up to the
current one (what ``RotaryEmbedding`` built before) would hold 3e6 x 64 x 2 float32
values, 1.5 GB: both strategies now compute the angles of the positions in the call
only.

Run: ``python benchmarks/bench_kv_cache.py [--repeats N] [--threads T]``.  A measurement
script, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import posenc
from posenc._memory import peak_tensor_mib as torch_peak_mib

BATCH, HEADS, KV_HEADS, HEAD_DIM = 1, 32, 8, 128  # Llama-3-8B-like attention, one layer


def peak_rss_growth_mib(fn):
    """Run ``fn``; return its peak resident-set growth in MiB, or None where unavailable."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current VmRSS
        before = _status_kib("VmRSS")
    except OSError:
        fn()
        return None
    fn()
    return (_status_kib("VmHWM") - before) / 1024


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(field)


def make_step(strategy, rope, length):
    """A cache filled with ``length`` keys and a function that runs one decoding step."""
    cache = posenc.KVCache(rope if strategy == "rotate-once" else None, capacity=2 * length)
    k = torch.randn(BATCH, KV_HEADS, length, HEAD_DIM)
    v = torch.randn(BATCH, KV_HEADS, length, HEAD_DIM)
    cache.update(torch.randn(BATCH, HEADS, length, HEAD_DIM), k, v)

    def step():
        q = torch.randn(BATCH, HEADS, 1, HEAD_DIM)
        k1 = torch.randn(BATCH, KV_HEADS, 1, HEAD_DIM)
        v1 = torch.randn(BATCH, KV_HEADS, 1, HEAD_DIM)
        q, keys, values = cache.update(q, k1, v1)
        if strategy == "rotate-once":
            return posenc.attention(q, keys, values, causal=True)
        return posenc.attention(q, keys, values, encoding=rope, causal=True)

    return step


def bench(length, repeats):
    rope = posenc.RotaryEmbedding(HEAD_DIM, layout="half", base=500000.0)
    steps = {s: make_step(s, rope, length) for s in ("re-rotate", "rotate-once")}
    times = {s: [] for s in steps}
    for fn in steps.values():  # warm-up (and the cos/sin table reaches the cache length)
        fn()
    for _ in range(repeats):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {s: statistics.median(ts) for s, ts in times.items()}
    mem = {s: (torch_peak_mib(fn), peak_rss_growth_mib(fn)) for s, fn in steps.items()}
    return med, mem


def far_step():
    """One step at position 3,000,000 for each strategy (1k-key window for re-rotate)."""
    rope = posenc.RotaryEmbedding(HEAD_DIM, layout="half", base=500000.0)
    p = 3_000_000
    window = 1024
    k = torch.randn(BATCH, KV_HEADS, window, HEAD_DIM)
    v = torch.randn(BATCH, KV_HEADS, window, HEAD_DIM)
    q = torch.randn(BATCH, HEADS, 1, HEAD_DIM)
    k_pos = torch.arange(p - window + 1, p + 1)

    def rerotate():
        return posenc.attention(q, k, v, encoding=rope, k_positions=k_pos, q_positions=k_pos[-1:])

    def once():
        cache = posenc.KVCache(rope)
        q_rot, keys, values = cache.update(q, k[:, :, -1:], v[:, :, -1:], torch.tensor([p]))
        return posenc.attention(q_rot, keys, values)

    return {"re-rotate (1k window)": rerotate, "rotate-once": once}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {BATCH}, "
        f"{HEADS} query heads, {KV_HEADS} key/value heads, head_dim {HEAD_DIM}, float32; "
        f"{args.repeats} repeats"
    )
    print(f"{'':10s} {'median ms per step':^38s} {'torch peak MiB':^19s} {'RSS growth MiB':^19s}")
    print(
        f"{'cache keys':>10s} {'re-rotate':>12s} {'rotate-once':>12s} {'ratio':>12s}"
        f" {'re-rotate':>9s} {'once':>9s} {'re-rotate':>9s} {'once':>9s}"
    )

    def fmt(m):
        return f"{m:9.1f}" if m is not None else f"{'n/a':>9s}"

    for length in (1024, 4096, 16384):
        med, mem = bench(length, args.repeats)
        a, b = med["re-rotate"], med["rotate-once"]
        (tr, rr), (to, ro) = mem["re-rotate"], mem["rotate-once"]
        print(
            f"{length:10d} {1e3 * a:12.2f} {1e3 * b:12.2f} {a / b:11.1f}x"
            f" {fmt(tr)} {fmt(to)} {fmt(rr)} {fmt(ro)}"
        )
    print("\none step at position 3,000,000 (a table up to it would be 1.5 GB):")
    for name, fn in far_step().items():
        fn()  # warm-up
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        rss = peak_rss_growth_mib(fn)
        shown = f"{rss:.1f} MiB" if rss is not None else "n/a"
        print(
            f"  {name:22s} {1e3 * dt:8.2f} ms, torch peak {torch_peak_mib(fn):.2f} MiB, "
            f"RSS growth {shown}"
        )


if __name__ == "__main__":
    main()
