"""Fused attention (posenc.flex) and the one-pass RoPE, against SDPA, a read+write and the peers.

Everything runs side by side in one process; candidates are interleaved within
each repeat so that they see the same machine load, and the medians over the
repeats are printed with ratios to a baseline measured in the same run:

* attention at (1, 8, 2048, 64) float32, causal: ratio to SDPA with
  ``is_causal=True`` (no bias at all, the fastest kernel PyTorch has here);
  the schemes of issue 20 are also judged against ALiBi's fused path (Kerple,
  FIRE) and, for CoPE's eager path, against SDPA with a dense bias;
* RoPE: ratio to a read+write of the same tensor with the same allocation
  (``x * 2``, which allocates its output, for candidates that allocate);
  q and k together: ratio to two such read+writes.

* many shapes (issue 21, first, and alone with ``--many-shapes-only``): ALiBi at
  (1, 8, n, 64) causal float32 over 20 lengths met in a row, per-call time and
  memory of ``backend="flex"`` and ``"auto"`` beside SDPA with a dense bias,
  each length's first call (compile or guard check) apart, the fused path on
  arrival against its steady state, then one-query decoding steps; written to
  ``benchmarks/results/fused_many_shapes.json`` with the CPU model, cores,
  torch version and load average (the book's performance appendix plots it).

Extra memory is the peak of tensor memory a call allocates and holds, from
``torch.profiler``'s allocation records (``benchmarks/bench_kv_cache.py``
explains the measure), minus the output itself; the process's peak RSS growth
is printed beside it.  Compile time (the first call of each compiled candidate,
which also warms it up) is reported separately and never enters the medians.
Where CUDA is present, the RoPE rows also print bandwidth as a fraction of a
device copy.

Peers come from the ``bench`` extra (``pip install -e ".[bench]"``): the
transformers formula (``apply_rotary_pos_emb`` of LLaMA, ALiBi of BLOOM),
x-transformers, rotary-embedding-torch and torchtune.  A peer that cannot be
imported is skipped with the reason printed.

* schemes (issue 26 item 6, alone with ``--schemes-only``): Kerple (log and
  power) and FIRE against ALiBi's fused path at (1, 8, 2048, 64), causal,
  float32, in ``--rounds`` rounds of interleaved repeats (the range over the
  rounds is the spread the load leaves), with each path's extra memory and its
  largest difference from the eager path; written to
  ``benchmarks/results/fused_schemes_<isa>.json`` with the CPU, the
  instruction set PyTorch and Inductor used and the load average.

A process cannot change its instruction set: ``--isa avx2`` runs the script
again in a subprocess with ``ATEN_CPU_CAPABILITY=avx2``,
``MKL_ENABLE_INSTRUCTIONS=AVX2`` and ``ONEDNN_MAX_CPU_ISA=AVX2`` (PyTorch and
Inductor then take their AVX2 code paths, 8-lane vectors; on a CPU with
AVX-512 the compiler may still use AVX-512 instructions inside them).

A verdict per target of issues 14, 20 and 26 closes the output; a miss prints the measured
floor that explains it.  Run: ``python benchmarks/bench_fused.py [--repeats N]
[--attention-only | --many-shapes-only | --schemes-only [--rounds R]] [--isa avx2]``.
A measurement script, not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

import torch
import torch.nn.functional as F

import posenc
from posenc import _memory

try:  # same directory: the memory measures shared with the KV-cache benchmark
    from bench_kv_cache import peak_rss_growth_mib, torch_peak_mib
except ImportError:  # run from elsewhere
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_kv_cache import peak_rss_growth_mib, torch_peak_mib

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def sync():
    if CUDA:
        torch.cuda.synchronize()


def run_side_by_side(fns: dict, repeats: int) -> tuple[dict, dict]:
    """First-call time (compile) and median time of each candidate, interleaved."""
    first = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        sync()
        first[name] = time.perf_counter() - t0
        fn()  # a second warm-up: caches, page faults of the first output
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return first, {name: statistics.median(ts) for name, ts in times.items()}


def memory(fn, out_bytes: int) -> tuple[float, float | None]:
    """Extra tensor memory (MiB) held during ``fn()`` beyond its output, and RSS growth."""
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        sync()
        return (torch.cuda.max_memory_allocated() - before - out_bytes) / 2**20, None
    peak = torch_peak_mib(fn)
    rss = peak_rss_growth_mib(fn)
    return peak - out_bytes / 2**20, rss


def peer(name, build):
    """``build()`` or ``None`` with the reason printed (a peer that is not installed)."""
    try:
        return build()
    except Exception as exc:  # ImportError, or a peer whose import needs what is missing
        why = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        print(f"  (skipped {name}: {type(exc).__name__}: {why[:100]})")
        return None


# --- attention ---------------------------------------------------------------------------------


def attention_section(repeats: int):
    batch, heads, n, d = 1, 8, 2048, 64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, d, generator=g).to(DEVICE) for _ in range(3))
    alibi = posenc.ALiBi(heads)
    t5 = posenc.T5RelativeBias(heads).to(DEVICE)
    slopes = alibi.slopes.to(DEVICE, torch.float32)
    # the dense bias a model could build once and share across its layers
    dense = posenc.alibi_bias(heads, n, causal=False, device=DEVICE)
    keep = posenc.causal_mask(n, n, device=DEVICE)
    mask4 = dense.masked_fill(~keep, -math.inf)[None].contiguous()
    mask3 = mask4[0]
    with torch.no_grad():
        t5_dense = t5(n).float()
    t5_mask4 = t5_dense.masked_fill(~keep, -math.inf)[None].contiguous()

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    block = create_block_mask(lambda b, h, qi, ki: ki <= qi, None, None, n, n, device=DEVICE)
    # the schemes of issue 20 at their initial parameters (speed does not depend on them)
    fire = posenc.FIRE(heads).to(DEVICE)
    cope = posenc.CoPE(heads, d, n + 1).to(DEVICE)

    def docs_alibi(score, b, h, qi, ki):  # the ALiBi of PyTorch's FlexAttention docs
        return score + slopes[h] * (ki - qi)

    flex = torch.compile(flex_attention, dynamic=False)  # as a user writes it for one shape
    fns = {
        "SDPA is_causal (baseline)": lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=True
        ),
        "ALiBi posenc backend='eager'": lambda: posenc.attention(
            q, k, v, encoding=alibi, causal=True, backend="eager"
        ),
        "ALiBi posenc backend='flex'": lambda: posenc.attention(
            q, k, v, encoding=alibi, causal=True, backend="flex"
        ),
        "ALiBi posenc backend='auto'": lambda: posenc.attention(
            q, k, v, encoding=alibi, causal=True
        ),
        "ALiBi SDPA, prebuilt 4-D mask": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask4
        ),
        "ALiBi SDPA, prebuilt 3-D mask": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask3
        ),
        "ALiBi plain compiled FlexAttention": lambda: flex(
            q, k, v, score_mod=docs_alibi, block_mask=block
        ),
        "floor: FlexAttention, causal only": lambda: flex(q, k, v, block_mask=block),
        "T5 posenc backend='eager'": lambda: posenc.attention(
            q, k, v, encoding=t5, causal=True, backend="eager"
        ),
        "T5 posenc backend='flex'": lambda: posenc.attention(
            q, k, v, encoding=t5, causal=True, backend="flex"
        ),
        "T5 SDPA, prebuilt 4-D mask": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=t5_mask4
        ),
        "FIRE posenc backend='flex'": lambda: posenc.attention(
            q, k, v, encoding=fire, causal=True, backend="flex"
        ),
        "CoPE posenc backend='eager'": lambda: posenc.attention(
            q, k, v, encoding=cope, causal=True, backend="eager"
        ),
    }
    if hasattr(posenc, "Kerple"):  # written beside FIRE and CoPE (issue 20)
        kerple = posenc.Kerple(heads).to(DEVICE)
        fns["Kerple posenc backend='flex'"] = lambda: posenc.attention(
            q, k, v, encoding=kerple, causal=True, backend="flex"
        )
    else:
        print("  (skipped Kerple: posenc has no Kerple yet)")
    bloom = peer("transformers BLOOM ALiBi", lambda: _bloom_alibi(heads, n))
    if bloom is not None:
        fns["ALiBi transformers BLOOM recipe"] = lambda: bloom(q, k, v)
    xt = peer("x-transformers AlibiPositionalBias", lambda: _x_alibi(heads))
    if xt is not None:
        fns["ALiBi x-transformers + SDPA"] = lambda: xt(q, k, v)

    print(f"\nattention {tuple(q.shape)} float32 causal on {DEVICE}, {repeats} repeats")
    with torch.no_grad():
        first, med = run_side_by_side(fns, repeats)
        base = med["SDPA is_causal (baseline)"]
        out_bytes = q.numel() * q.element_size()
        print(f"  {'candidate':38s} {'ms':>8s} {'/ SDPA':>7s} {'extra MiB':>10s} "
              f"{'RSS MiB':>8s} {'1st call s':>10s}")  # fmt: skip
        mem = {}
        for name, t in med.items():
            extra, rss = memory(fns[name], out_bytes)
            mem[name] = extra
            rss_s = "n/a" if rss is None else f"{rss:.0f}"
            print(f"  {name:38s} {1e3 * t:8.1f} {t / base:7.2f} {extra:10.1f} {rss_s:>8s} "
                  f"{first[name]:10.2f}")  # fmt: skip
    return {name: t / base for name, t in med.items()}, mem


def _bloom_alibi(heads, n):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    def run(q, k, v):
        mask = torch.ones(1, n, device=q.device)
        alibi = build_alibi_tensor(mask, heads, torch.float32).view(1, heads, 1, n)
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        bias = alibi.masked_fill(~causal, -math.inf)  # softmax-equivalent to -m|i - j|
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    return run


def _x_alibi(heads):
    from x_transformers.x_transformers import AlibiPositionalBias

    module = AlibiPositionalBias(heads=heads, total_heads=heads).to(DEVICE)

    def run(q, k, v):
        n = q.shape[-2]
        bias = module(n, n)
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        mask = bias.masked_fill(~causal, -math.inf)[None].contiguous()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    return run


# --- RoPE --------------------------------------------------------------------------------------


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _floor_table(x, c):  # one read of x and of a float32 table, one rounded write
    return (x.float() * c).to(x.dtype)


def _floor_pair(q, k):
    return q * 2, k * 2


def _swap_pairs(x):  # the interleaved layout's shuffle alone: (a, b) -> (-b, a), no table
    p = x.unflatten(-1, (-1, 2))
    return torch.stack((-p[..., 1], p[..., 0]), -1).flatten(-2)


def rope_section(shape, dtype, repeats: int):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(device=DEVICE, dtype=dtype)
    k = torch.randn(shape, generator=g).to(device=DEVICE, dtype=dtype)
    seq, dim = shape[-2:]
    pos = torch.arange(seq, device=DEVICE)
    cos, sin = posenc.rope_cos_sin(range(seq), dim, device=DEVICE)
    cos2, sin2 = (torch.cat((t, t), -1).to(dtype) for t in (cos, sin))  # transformers tables
    full_cos = torch.cat((cos, cos), -1)
    floor_table = torch.compile(_floor_table, dynamic=False)
    floor_pair = torch.compile(_floor_pair, dynamic=False)
    swap = {
        "interleaved": torch.compile(_swap_pairs, dynamic=False),
        "half": torch.compile(rotate_half, dynamic=False),
    }
    fused = {lay: posenc.RotaryEmbedding(dim, layout=lay, compiled=True) for lay in ("half",
             "interleaved")}  # fmt: skip
    eager = {lay: posenc.RotaryEmbedding(dim, layout=lay) for lay in ("half", "interleaved")}
    # the hooks' (q, k, ctx) form, the context made once outside the timing
    ctx = posenc.CallContext.of(x, k, q_positions=pos, k_positions=pos)
    fns = {
        "copy allocating (x * 2)": lambda: x * 2,
        "copy allocating, huge pages": lambda: torch.mul(
            x, 2, out=_memory.empty(*x.shape, dtype=x.dtype, device=x.device)
        ),
        "posenc interleaved, eager": lambda: posenc.apply_rope(x),
        "posenc half, eager": lambda: posenc.apply_rope(x, layout="half"),
        "posenc interleaved, compiled": lambda: posenc.apply_rope(x, compiled=True),
        "posenc half, compiled": lambda: posenc.apply_rope(x, layout="half", compiled=True),
        "floor: compiled x * table": lambda: floor_table(x, full_cos),
        "floor: interleaved pair swap alone, compiled": lambda: swap["interleaved"](x),
        "floor: half-row swap alone, compiled": lambda: swap["half"](x),
        "transformers formula (half)": lambda: x * cos2 + rotate_half(x) * sin2,
        "two copies allocating": lambda: (x * 2, k * 2),
        "floor: two copies, one compiled graph": lambda: floor_pair(x, k),
        "q+k posenc half, eager": lambda: eager["half"].rotate(x, k, ctx),
        "q+k posenc half, compiled": lambda: fused["half"].rotate(x, k, ctx),
        "q+k posenc interleaved, compiled": lambda: fused["interleaved"].rotate(x, k, ctx),
    }
    tf = peer("transformers apply_rotary_pos_emb", _transformers_rope)
    if tf is not None:
        c4, s4 = cos2[None, None], sin2[None, None]
        fns["q+k transformers apply_rotary_pos_emb"] = lambda: tf(x, k, c4, s4)
    rer = peer("rotary-embedding-torch", lambda: _rer(dim))
    if rer is not None:
        fns["rotary-embedding-torch (interleaved)"] = lambda: rer(x)
    xt = peer("x-transformers RotaryEmbedding", lambda: _x_rope(dim, seq))
    if xt is not None:
        fns["x-transformers (half)"] = lambda: xt(x)
    tt = peer("torchtune RotaryPositionalEmbeddings", lambda: _torchtune_rope(dim, seq))
    if tt is not None:
        x_bshd = x.transpose(1, 2).contiguous()  # torchtune's (batch, seq, heads, dim)
        fns["torchtune (interleaved, b s h d)"] = lambda: tt(x_bshd)

    name = str(dtype).removeprefix("torch.")
    print(f"\nRoPE {tuple(shape)} {name} on {DEVICE}, {repeats} repeats")
    with torch.no_grad():
        first, med = run_side_by_side(fns, repeats)
    one, two = med["copy allocating (x * 2)"], med["two copies allocating"]
    print(f"  {'candidate':40s} {'ms':>8s} {'/ copy':>7s} {'1st call s':>10s}"
          + ("  of device copy bandwidth" if CUDA else ""))  # fmt: skip
    ratios = {}
    for cand, t in med.items():
        ref = two if (cand.startswith(("q+k", "two", "floor: two"))) else one
        ratios[cand] = t / ref
        bw = f"  {ref / t:6.2f}" if CUDA else ""
        print(f"  {cand:40s} {1e3 * t:8.2f} {t / ref:7.2f} {first[cand]:10.2f}{bw}")
    return ratios


def _transformers_rope():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    return apply_rotary_pos_emb


def _rer(dim):
    from rotary_embedding_torch import RotaryEmbedding

    module = RotaryEmbedding(dim=dim).to(DEVICE)
    return module.rotate_queries_or_keys


def _x_rope(dim, seq):
    from x_transformers.x_transformers import RotaryEmbedding, apply_rotary_pos_emb

    module = RotaryEmbedding(dim).to(DEVICE)
    freqs, _ = module.forward_from_seq_len(seq)
    return lambda x: apply_rotary_pos_emb(x, freqs)


def _torchtune_rope(dim, seq):
    from torchtune.modules import RotaryPositionalEmbeddings

    return RotaryPositionalEmbeddings(dim, max_seq_len=seq).to(DEVICE)


# --- many shapes (issue 21): a new prompt length every call ------------------------------------

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def machine() -> dict:
    """What the numbers were measured on: CPU model, cores, torch, threads, load average."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "device": torch.cuda.get_device_name() if CUDA else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **instruction_sets(),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


# What --isa avx2 sets: PyTorch's kernels, MKL and oneDNN all on their AVX2 code paths.
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "ONEDNN_MAX_CPU_ISA": "AVX2"}  # fmt: skip


def instruction_sets() -> dict:
    """The CPU's widest vector ISA and the ones PyTorch and Inductor use in this process."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        flags = []
    cpu = next((isa for isa in ("avx512f", "avx2") if isa in flags), "unknown")
    try:
        from torch._inductor import cpu_vec_isa

        inductor = str(cpu_vec_isa.pick_vec_isa()) or "none"
    except Exception:  # no compiler: Inductor picks no ISA
        inductor = "none"
    return {
        "cpu_isa": {"avx512f": "avx512", "avx2": "avx2"}.get(cpu, cpu),
        "pytorch_isa": torch.backends.cpu.get_cpu_capability().lower(),
        "inductor_isa": inductor,
        "isa_env": {k: os.environ[k] for k in AVX2_ENV if k in os.environ},
    }


def rerun_with_isa(isa: str) -> int | None:
    """Run this script again under ``isa`` when this process runs another; its exit code.

    ``None`` when the process already runs ``isa`` (the caller goes on).  The
    instruction set is fixed when PyTorch loads, so it takes a new process.
    """
    if isa == "native" or all(os.environ.get(k) == v for k, v in AVX2_ENV.items()):
        return None
    print(f"re-running under {' '.join(f'{k}={v}' for k, v in AVX2_ENV.items())}", flush=True)
    return subprocess.call([sys.executable, *sys.argv], env={**os.environ, **AVX2_ENV})


def compile_counts() -> dict:
    """Graphs compiled so far in this process: Dynamo's, and Inductor's on-disk cache use.

    ``graphs`` is Dynamo's ``counters["stats"]["unique_graphs"]``: it grows by
    one for every graph Dynamo captures and compiles, a first compile or a
    recompile; ``fx_cache_hits`` and ``fx_cache_misses`` say whether Inductor
    then loaded the compiled code from its on-disk cache or generated and
    built it (the slow part of a cold compile).
    """
    from torch._dynamo.utils import counters

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "fx_cache_hits": counters["inductor"]["fxgraph_cache_hit"],
        "fx_cache_misses": counters["inductor"]["fxgraph_cache_miss"],
    }


def compiled_during(fn) -> tuple[float, dict]:
    """Run ``fn`` once: its time in seconds, and what it compiled (see :func:`compile_counts`)."""
    before = compile_counts()
    t0 = time.perf_counter()
    fn()
    sync()
    elapsed = time.perf_counter() - t0
    return elapsed, {k: v - before[k] for k, v in compile_counts().items()}


def many_shapes_section(repeats: int, lengths: list[int]) -> dict:
    """ALiBi (1, 8, n, 64) causal float32 at 20 lengths: per-call time and memory against SDPA.

    Each length arrives once, as a server sees a new prompt length: its first
    call (which compiles, or not), then ``repeats`` calls of each candidate
    interleaved.  After every length has been seen, a second pass measures
    the fused path's steady state at each length; the "arrival / steady"
    ratio shows whether a late length is slower than it would be on a warm
    path (the recompile cliff of issue 21).  Then decoding steps (one query)
    at five cache lengths on ``backend="flex"``.  Every first call, and each
    pass as a whole, records the graphs Dynamo compiled during it
    (:func:`compile_counts`): "nothing more is compiled" is counted, not
    inferred from a time.
    """
    alibi = posenc.ALiBi(8)
    g = torch.Generator().manual_seed(0)
    start = machine()
    load = start["load_average_1_5_15"]
    print(f"\nmany shapes: ALiBi (1, 8, n, 64) causal float32 on {DEVICE}, "
          f"{len(lengths)} lengths, {repeats} repeats; load {load}")  # fmt: skip
    inputs = {n: [torch.randn(1, 8, n, 64, generator=g).to(DEVICE) for _ in range(3)]
              for n in lengths}  # fmt: skip

    def fns(n):
        q, k, v = inputs[n]
        return {
            "flex": lambda: posenc.attention(q, k, v, encoding=alibi, causal=True, backend="flex"),
            "auto": lambda: posenc.attention(q, k, v, encoding=alibi, causal=True),
            "sdpa_dense_bias": lambda: posenc.attention(
                q, k, v, encoding=alibi, causal=True, backend="eager"
            ),
        }

    rows = []
    print(f"  {'n':>5s} {'1st flex s':>10s} {'flex ms':>8s} {'auto ms':>8s} {'SDPA+bias ms':>12s} "
          f"{'flex/SDPA':>9s} {'flex MiB':>8s} {'SDPA MiB':>8s} {'graphs':>6s}")  # fmt: skip
    with torch.no_grad():
        for n in lengths:
            f = fns(n)
            first, compiled = compiled_during(f["flex"])
            # auto's first call at this length (compiled already, or eager below its threshold)
            _, auto_compiled = compiled_during(f["auto"])
            f["sdpa_dense_bias"]()
            before_timing = compile_counts()["graphs"]
            times = {name: [] for name in f}
            for _ in range(repeats):
                for name, fn in f.items():
                    sync()
                    t0 = time.perf_counter()
                    fn()
                    sync()
                    times[name].append(time.perf_counter() - t0)
            med = {name: statistics.median(ts) for name, ts in times.items()}
            out_bytes = 8 * n * 64 * 4
            mem = {name: memory(f[name], out_bytes)[0] for name in ("flex", "sdpa_dense_bias")}
            row = {"n": n, "first_call_s": first, **{f"{k}_s": t for k, t in med.items()},
                   **{f"{k}_extra_mib": m for k, m in mem.items()},
                   "first_call_compiled": compiled, "auto_first_call_compiled": auto_compiled,
                   "graphs_compiled_while_timing": compile_counts()["graphs"] - before_timing,
                   }  # fmt: skip
            rows.append(row)
            dense = med["sdpa_dense_bias"]
            print(f"  {n:5d} {first:10.2f} {1e3 * med['flex']:8.1f} {1e3 * med['auto']:8.1f} "
                  f"{1e3 * dense:12.1f} {med['flex'] / dense:9.2f} "
                  f"{mem['flex']:8.1f} {mem['sdpa_dense_bias']:8.1f} "
                  f"{compiled['graphs']:6d}")  # fmt: skip
        # the fused path's steady state: every length seen, nothing left to compile
        # (SDPA with a dense bias again beside it: the load drifts between the passes,
        # so arrival / steady is also given relative to SDPA in each pass)
        before_steady = compile_counts()["graphs"]
        for row in rows:
            f = fns(row["n"])
            ts = {"flex": [], "sdpa_dense_bias": []}
            for _ in range(repeats):
                for name in ts:
                    sync()
                    t0 = time.perf_counter()
                    f[name]()
                    sync()
                    ts[name].append(time.perf_counter() - t0)
            row["flex_steady_s"] = statistics.median(ts["flex"])
            row["sdpa_dense_bias_steady_s"] = statistics.median(ts["sdpa_dense_bias"])
        steady_compiled = compile_counts()["graphs"] - before_steady
        decode = []
        q1 = torch.randn(1, 8, 1, 64, generator=g).to(DEVICE)
        for n in lengths[-5:]:
            _, k, v = inputs[n]
            step = compiled_during(
                lambda k=k, v=v: posenc.attention(
                    q1, k, v, encoding=alibi, causal=True, backend="flex"
                )
            )
            decode.append({"k_len": n, "first_call_s": step[0], "first_call_compiled": step[1]})
    last = rows[len(rows) // 2 :]
    summary = {
        "first_compile_s": rows[0]["first_call_s"],
        "new_length_first_call_s": [r["first_call_s"] for r in rows[1:]],
        "median_flex_over_sdpa_dense_bias_last_half": statistics.median(
            r["flex_s"] / r["sdpa_dense_bias_s"] for r in last
        ),
        "median_auto_over_sdpa_dense_bias_last_half": statistics.median(
            r["auto_s"] / r["sdpa_dense_bias_s"] for r in last
        ),
        "median_arrival_over_steady_last_half": statistics.median(
            r["flex_s"] / r["flex_steady_s"] for r in last
        ),
        "median_arrival_over_steady_relative_to_sdpa_last_half": statistics.median(
            (r["flex_s"] / r["sdpa_dense_bias_s"])
            / (r["flex_steady_s"] / r["sdpa_dense_bias_steady_s"])
            for r in last
        ),
        "max_flex_extra_mib": max(r["flex_extra_mib"] for r in rows),
        "graphs_compiled_by_first_calls": [r["first_call_compiled"]["graphs"] for r in rows],
        "graphs_compiled_in_steady_pass": steady_compiled,
        "graphs_compiled_by_first_decoding_steps": [
            d["first_call_compiled"]["graphs"] for d in decode
        ],
    }
    later = summary["new_length_first_call_s"]
    print(f"  first compile {summary['first_compile_s']:.1f} s; first call at a new length "
          f"{min(later):.2f}-{max(later):.2f} s (includes the call itself)")  # fmt: skip
    print(
        "  decode (one query) on flex, first call at a new cache length: "
        + ", ".join(f"{d['k_len']}: {d['first_call_s']:.2f} s" for d in decode)
    )
    print(f"  graphs Dynamo compiled: first calls {summary['graphs_compiled_by_first_calls']}, "
          f"steady pass {steady_compiled}, first decoding steps "
          f"{summary['graphs_compiled_by_first_decoding_steps']}")  # fmt: skip
    verdict("many shapes, last half: flex / SDPA with a dense bias (median)",
            summary["median_flex_over_sdpa_dense_bias_last_half"], 2.5)  # fmt: skip
    verdict("many shapes, last half: auto / SDPA with a dense bias (median)",
            summary["median_auto_over_sdpa_dense_bias_last_half"], 2.5)  # fmt: skip
    verdict("many shapes, last half: flex on arrival / flex steady state (median)",
            summary["median_arrival_over_steady_last_half"], 1.2)  # fmt: skip
    verdict("many shapes, last half: the same, each relative to SDPA in its pass (median)",
            summary["median_arrival_over_steady_relative_to_sdpa_last_half"], 1.2)  # fmt: skip
    result = {
        "benchmark": "bench_fused.py many shapes",
        "workload": "posenc.attention, ALiBi, (1, 8, n, 64), causal, float32, no grad",
        "machine": start,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "repeats": repeats,
        "rows": rows,
        "decode": decode,
        "summary": summary,
    }
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, "fused_many_shapes.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"  written to {os.path.relpath(path)}")
    return result


# --- schemes (issue 26 item 6): Kerple and FIRE against ALiBi's fused path, per ISA ------------

# Targets against ALiBi's fused path at (1, 8, 2048, 64), causal, float32 (issues 20 and 26).
SCHEME_TARGETS = {"Kerple log": 1.2, "Kerple power": 1.2, "FIRE": 2.0}
# FoX (issue 36 item 4): the data-dependent gate bound to a random input, and the fixed gate
FOX_TARGETS = {"FoX data gate": 1.3, "FoX fixed gate": 1.3}


def schemes_section(
    repeats: int, rounds: int, label: str = "", note: str = "", fox: bool = False
) -> dict:
    """Kerple (log, power) and FIRE through ``backend="flex"`` against ALiBi's, side by side.

    Every round times the candidates interleaved, ``repeats`` times each, and
    takes medians; the ratios to ALiBi are per round, so the spread over the
    rounds shows what the load does to them.  Before the rounds, each path's
    first call (its compile) and its largest difference from the eager path on
    the same inputs (float32, and from float64 eager) are recorded; after the
    first round, each path's extra memory.  Parameters are the schemes' initial
    ones (``torch.manual_seed(0)``); FIRE's cost does not depend on them, and
    Kerple's tables hold one entry per head and distance whatever they are.
    """
    batch, heads, n, d = 1, 8, 2048, 64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, d, generator=g).to(DEVICE) for _ in range(3))
    torch.manual_seed(0)
    schemes = {
        "ALiBi": posenc.ALiBi(heads),
        "Kerple log": posenc.Kerple(heads, "log"),
        "Kerple power": posenc.Kerple(heads, "power"),
        "FIRE": posenc.FIRE(heads),
    }
    targets = SCHEME_TARGETS
    if fox:  # --fox: FoX's two gates instead of Kerple and FIRE (fox_fused_<isa>.json)
        gate = posenc.ForgettingAttention(heads, heads * d)
        x = torch.randn(batch, n, heads * d, generator=g)
        schemes = {
            "ALiBi": posenc.ALiBi(heads),
            "FoX data gate": gate.bind(x).requires_grad_(False),
            "FoX fixed gate": posenc.ForgettingAttention(heads, gate="fixed").requires_grad_(False),
        }
        targets = FOX_TARGETS
    schemes = {name: s.to(DEVICE) for name, s in schemes.items()}

    def fused(scheme):
        return lambda: posenc.attention(q, k, v, encoding=scheme, causal=True, backend="flex")

    fns = {name: fused(s) for name, s in schemes.items()}
    fns["floor: FlexAttention, no score change"] = fused(None)
    fns["SDPA is_causal"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    start = machine()
    print(f"\nschemes against ALiBi's fused path: (1, {heads}, {n}, {d}) float32 causal on "
          f"{DEVICE}; CPU {start['cpu_isa']}, PyTorch {start['pytorch_isa']}, Inductor "
          f"{start['inductor_isa']}; {rounds} rounds of {repeats} repeats; "
          f"load {start['load_average_1_5_15']}")  # fmt: skip
    out_bytes = q.numel() * q.element_size()
    result = {
        "benchmark": "bench_fused.py schemes",
        "workload": f"posenc.attention(backend='flex'), (1, {heads}, {n}, {d}), causal, "
        "float32, no grad; ratios to ALiBi's fused path",
        "label": label,
        "note": note,
        "machine": start,
        "repeats": repeats,
        "targets_over_alibi": targets,
        "first_call_s": {},
        "max_abs_diff_from_eager": {},
        "max_abs_diff_from_float64_eager": {},
        "extra_mib": {},
        "rounds": [],
    }
    with torch.no_grad():
        for name, fn in fns.items():
            t0 = time.perf_counter()
            got = fn()
            sync()
            result["first_call_s"][name] = time.perf_counter() - t0
            if name in schemes:
                s = schemes[name]
                eager = posenc.attention(q, k, v, encoding=s, causal=True, backend="eager")
                wide = posenc.attention(q.double(), k.double(), v.double(), causal=True,
                                        encoding=s.double(), backend="eager")  # fmt: skip
                s.float()
                result["max_abs_diff_from_eager"][name] = (got - eager).abs().max().item()
                result["max_abs_diff_from_float64_eager"][name] = (
                    (got.double() - wide).abs().max().item()
                )
        for r in range(rounds):
            load = [round(x, 2) for x in os.getloadavg()]
            _, med = run_side_by_side(fns, repeats)
            base = med["ALiBi"]
            result["rounds"].append({
                "load_average_1_5_15": load,
                "median_s": med,
                "over_alibi": {name: t / base for name, t in med.items()},
            })  # fmt: skip
            if r == 0:
                for name, fn in fns.items():
                    result["extra_mib"][name] = memory(fn, out_bytes)[0]
            ratios = ", ".join(f"{name} {t / base:.2f}x" for name, t in med.items()
                               if name in targets)  # fmt: skip
            print(f"  round {r + 1}: ALiBi {1e3 * base:.1f} ms; {ratios}; load {load}")
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    summary = {}
    print(f"  {'candidate':38s} {'ms':>7s} {'/ ALiBi: median':>15s} {'range':>13s} "
          f"{'extra MiB':>9s} {'1st call s':>10s} {'vs eager':>9s}")  # fmt: skip
    for name in fns:
        ratios = [rd["over_alibi"][name] for rd in result["rounds"]]
        ms = statistics.median(rd["median_s"][name] for rd in result["rounds"]) * 1e3
        summary[name] = {"median": statistics.median(ratios), "min": min(ratios),
                         "max": max(ratios)}  # fmt: skip
        diff = result["max_abs_diff_from_eager"].get(name)
        diff_s = "" if diff is None else f"{diff:9.1e}"
        print(f"  {name:38s} {ms:7.1f} {summary[name]['median']:15.2f} "
              f"{min(ratios):6.2f}-{max(ratios):<6.2f} {result['extra_mib'][name]:9.1f} "
              f"{result['first_call_s'][name]:10.1f} {diff_s}")  # fmt: skip
    result["summary_over_alibi"] = summary
    for name, target in targets.items():
        met = sum(rd["over_alibi"][name] <= target for rd in result["rounds"])
        verdict(f"{name} flex / ALiBi flex ({start['pytorch_isa']}), median of {rounds} "
                f"rounds; met in {met} of {rounds}", summary[name]["median"], target)  # fmt: skip
    os.makedirs(RESULTS, exist_ok=True)
    kind = "fox_fused" if fox else "fused_schemes"
    stem = f"{kind}_{start['pytorch_isa']}" + (f"_{label}" if label else "")
    path = os.path.join(RESULTS, f"{stem}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"  written to {os.path.relpath(path)}")
    return result


# --- verdicts ----------------------------------------------------------------------------------


def verdict(label, value, target, floor=None, why=""):
    ok = value <= target
    line = f"  {'meets ' if ok else 'MISSES'} {label}: {value:.2f}x (target <= {target}x)"
    if not ok and floor is not None:
        line += f"; measured floor {floor:.2f}x: {why}"
    print(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--attention-only", action="store_true", help="skip the RoPE sections")
    parser.add_argument(
        "--many-shapes-only", action="store_true", help="only the 20-length run (issue 21)"
    )
    parser.add_argument(
        "--schemes-only", action="store_true",
        help="only Kerple and FIRE against ALiBi's fused path (issue 26)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the schemes run")
    parser.add_argument(
        "--fox", action="store_true", help="with --schemes-only: FoX's gates instead (issue 36)"
    )
    parser.add_argument(
        "--isa", choices=("native", "avx2"), default="native",
        help="avx2: run again in a subprocess on PyTorch's and Inductor's AVX2 code paths",
    )  # fmt: skip
    parser.add_argument("--label", default="", help="suffix of the schemes run's result file")
    parser.add_argument("--note", default="", help="stored with the schemes run (what code ran)")
    args = parser.parse_args()
    code = rerun_with_isa(args.isa)
    if code is not None:
        sys.exit(code)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {DEVICE}")
    if args.schemes_only:
        schemes_section(args.repeats, args.rounds, args.label, args.note, fox=args.fox)
        return
    many_shapes_section(max(3, args.repeats // 3), list(range(1000, 3000, 100)))
    if args.many_shapes_only:
        return
    att, mem = attention_section(args.repeats)
    if not args.attention_only:
        fp32 = rope_section((1, 32, 4096, 128), torch.float32, args.repeats)
        bf16 = rope_section((8, 16, 1024, 64), torch.bfloat16, args.repeats)

    print("\nverdicts (ratios measured side by side in this run)")
    floor = att["floor: FlexAttention, causal only"]
    for scheme in ("ALiBi", "T5"):
        r, extra = att[f"{scheme} posenc backend='flex'"], mem[f"{scheme} posenc backend='flex'"]
        why = "FlexAttention's CPU kernel with the causal block mask and no score_mod"
        verdict(f"{scheme} flex / SDPA is_causal", r, 3.0, floor, why)
        print(f"  {'meets ' if extra <= 8 else 'MISSES'} {scheme} flex extra memory: "
              f"{extra:.1f} MiB (target <= 8 MiB)")  # fmt: skip
        dense = att[f"{scheme} SDPA, prebuilt 4-D mask"]
        verdict(f"{scheme} dense 4-D mask built once (shared by layers) / SDPA", dense, 2.5)
        eager = att[f"{scheme} posenc backend='eager'"]
        verdict(f"{scheme} eager, dense bias built per call / SDPA", eager, 2.5, dense,
                "SDPA's fused kernel with a prebuilt mask; building and merging the 128 MiB "
                "bias each call costs the rest (use backend='flex' or 'auto')")  # fmt: skip
    alibi = att["ALiBi posenc backend='flex'"]
    for scheme, target in (("Kerple", 1.2), ("FIRE", 2.0)):  # issue 20: against ALiBi's fused path
        name = f"{scheme} posenc backend='flex'"
        if name not in att:
            continue
        verdict(f"{scheme} flex / ALiBi flex", att[name] / alibi, target)
        print(f"  {'meets ' if mem[name] <= 8 else 'MISSES'} {scheme} flex extra memory: "
              f"{mem[name]:.1f} MiB (target <= 8 MiB)")  # fmt: skip
    # CoPE: content-dependent positions, eager only; its O(n^2) memory against a dense bias.
    # A prebuilt mask is held outside the call, so its own (1, 8, 2048, 2048) float32 is added.
    cope, bias_mib = "CoPE posenc backend='eager'", 8 * 2048 * 2048 * 4 / 2**20
    alibi_eager = mem["ALiBi posenc backend='eager'"]
    prebuilt = mem["ALiBi SDPA, prebuilt 4-D mask"] + bias_mib
    print(f"  CoPE eager: {att[cope]:.2f}x SDPA is_causal, {att[cope] / alibi:.2f}x ALiBi flex; "
          f"extra memory {mem[cope]:.0f} MiB, against {alibi_eager:.0f} MiB for ALiBi eager "
          f"(SDPA with a dense bias built per call) and {prebuilt:.0f} MiB for SDPA with a "
          f"prebuilt dense bias ({bias_mib:.0f} MiB of it the bias)")  # fmt: skip
    if args.attention_only:
        return
    for label, ratios, target in (("fp32", fp32, 1.15), ("bf16", bf16, 1.5)):
        floor = ratios["floor: compiled x * table"]
        for lay, shuffle in (("interleaved", "interleaved pair swap"), ("half", "half-row swap")):
            # posenc's faster path for this layout, eager or compiled
            path = min(("eager", "compiled"), key=lambda m: ratios[f"posenc {lay}, {m}"])
            verdict(f"RoPE {lay} ({path}) / same-alloc copy, {label}",
                    ratios[f"posenc {lay}, {path}"], target, floor,
                    "one compiled read of x and a float32 table, one write; the "
                    f"{shuffle} alone, compiled with no arithmetic, costs "
                    f"{ratios[f'floor: {shuffle} alone, compiled']:.2f}x")  # fmt: skip
    for label, ratios in (("fp32", fp32), ("bf16", bf16)):
        verdict(f"q+k fused (half, compiled) / two read+writes, {label}",
                ratios["q+k posenc half, compiled"], 1.0,
                ratios["floor: two copies, one compiled graph"],
                "two copies compiled into one graph")  # fmt: skip


if __name__ == "__main__":
    main()
