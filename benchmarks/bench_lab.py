"""Training throughput of the lab's TinyDecoder as a fraction of a plain matmul.

For each scheme the lab trains, one training step (forward, backward, AdamW,
at the ``full`` preset's batch 32, length 32, width 64) is timed, and its
useful work, ``6 * parameters * tokens`` plus the attention products
(``12 * layers * batch * length**2 * d_model``, causal half counted in full),
is divided by the time.  The baseline is the FLOP rate of a plain float32
matmul with the MLP's shapes, ``(batch * length, d_model) @ (d_model, 4 d_model)``,
forward and backward, measured in the same process and interleaved with the
steps so both see the same machine load.  Medians over ``--repeats``.

Two rates per scheme: the bare step above (one fixed batch), and the lab's own
loop, ``posenc.lab.train`` (a fresh batch drawn each step, gradient clipping,
the learning-rate schedule), timed over the same number of steps.  For the
first scheme the loop's extra time is broken down: drawing a batch, clipping
the gradients, the schedule.  For every scheme the profiler gives the share of
the bare step's time spent in matrix products (the only work the FLOP count
counts) and the largest other ops.  Peak memory is the tensor memory held
during one bare step (``posenc._memory.peak_tensor_mib``).

The compiled step (``posenc.lab.train(..., compiled=True)``: forward pass and
loss compiled by ``torch.compile``, fused AdamW) is timed beside the eager one,
interleaved in the same repeats: its bare step (the compiled loss, backward and
fused AdamW on the fixed batch) and the lab loop with ``compiled=True``.  Its
compile time (the first two steps of the process's first model of that scheme,
wall clock, compile workers included) and its peak tensor memory are stored too
(``--no-compiled``: the eager step only).  Every time is taken twice: wall clock
(``time.perf_counter``) and this process's CPU time (``time.process_time``; with
one thread, the time the step ran on a core).  On a shared, loaded machine the
wall clock also counts the time other processes held the core and the CPU time
does not, so there the CPU-time ratios are the ones to read (the step and the
matmul are timed the same way).  The eager-only results made before the compiled
step existed are ``lab_throughput.json``; both steps, ``lab_throughput_fast.json``.

Run: ``python benchmarks/bench_lab.py [--repeats N] [--threads T] [--schemes a,b|all]
[--no-compiled] [--out FILE]``.  It prints numbers and, with ``--out``, stores them as JSON with the
CPU, thread count and load average (``benchmarks/results/lab_throughput.json``).

``--fflm`` times instead the flip-flop model of ``posenc.lab.flipflop`` (preset
``fflm``: one layer, two heads, width 64) per scheme: one step of the lab's own
loop (``posenc.lab.train`` on FFL(0.8), batch 16, 511 inputs: a fresh batch, the
forward and backward pass, clipping, AdamW, the schedule), the median of
``--repeats`` single steps after one warm-up step, and one forward pass over 8192
evaluation tokens at each length of ``--fflm-lengths`` (``8192 / length`` sequences,
the batches ``posenc.lab.flipflop.fflm`` scores: the evaluation's cost),
with the CPU and the load average before and after
(``benchmarks/results/fflm_step.json``).  Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

import posenc
import posenc.lab as lab
from posenc.lab.train import _CompiledLoss


def _model(scheme, config, task=None):
    """``(task, model)``: the language task and a fresh TinyDecoder at the config's sizes."""
    task = lab.LanguageTask() if task is None else task
    torch.manual_seed(0)
    model = lab.TinyDecoder(
        task.vocab, scheme, config.train_len, d_model=config.d_model, layers=config.layers,
        heads=config.heads, rope_base=config.rope_base,
    )  # fmt: skip
    return task, model


def _step_fn(scheme, config):
    task, model = _model(scheme, config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=False, foreach=True)
    gen = torch.Generator().manual_seed(0)
    inputs, targets, _ = task.batch(config.batch, config.train_len, gen)

    def step():
        loss = torch.nn.functional.cross_entropy(model(inputs).transpose(1, 2), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    params = sum(p.numel() for p in model.parameters())
    tokens = config.batch * config.train_len
    flops = 6 * params * tokens + 12 * config.layers * tokens * config.train_len * config.d_model
    return step, flops


def _fast_step_fn(scheme, config):
    """The compiled step on the bare step's batch: compiled loss, backward, fused AdamW."""
    task, model = _model(scheme, config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(0)
    inputs, targets, weights = task.batch(config.batch, config.train_len, gen)
    total = weights.sum()
    fast = _CompiledLoss(model, config.train_len, config.batch)

    def step():
        opt.zero_grad(set_to_none=True)
        fast.backward(inputs, targets, weights, total)
        opt.step()

    return step, fast


def _matmul_fn(config):
    m, k, n = config.batch * config.train_len, config.d_model, 4 * config.d_model
    a = torch.randn(m, k, requires_grad=True)
    b = torch.randn(k, n, requires_grad=True)

    def step():
        (a @ b).sum().backward()

    return step, 6 * m * k * n


def _loop_fn(scheme, config, steps, task=None, compiled=False):
    task, model = _model(scheme, config, task)

    def run():
        lab.train(
            model, task, length=config.train_len, steps=steps, batch=config.batch, lr=1e-3,
            compiled=compiled,
        )  # fmt: skip

    return run


def _parts(scheme, config):
    """Seconds per step of what the lab loop adds to the bare step, for ``scheme``."""
    task, model = _model(scheme, config)
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    inputs, targets, _ = task.batch(config.batch, config.train_len, gen)
    torch.nn.functional.cross_entropy(model(inputs).transpose(1, 2), targets).backward()
    opt.step()
    return {
        "draw_batch": _time(lambda: task.batch(config.batch, config.train_len, gen), 20),
        "clip_grad_norm": _time(
            lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0), 20
        ),
        "schedule_step": _time(sched.step, 20),
    }


#: Profiler op names of matrix products (the work the FLOP count is made of).
_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "scaled_dot_product")


def _profile(step, steps=10) -> dict:
    """Where a step's time goes (torch.profiler, self CPU time): the share in matrix
    products, and the five largest other ops, in ms per step."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    products = sum(e.self_cpu_time_total for e in events if any(k in e.key for k in _PRODUCTS))
    others = sorted(
        ((e.self_cpu_time_total, e.key) for e in events if not any(k in e.key for k in _PRODUCTS)),
        reverse=True,
    )[:5]
    return {
        "matrix_product_share": round(products / total, 3),
        "largest_other_ops_ms_per_step": {k: round(t / steps / 1e3, 3) for t, k in others},
    }


def _time(fn, inner=5):
    return _times(fn, inner)[0]


def _times(fn, inner=5):
    """``(wall, cpu)`` seconds per call of ``fn``: wall clock and this process's CPU time."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - wall) / inner, (time.process_time() - cpu) / inner


def _median(pairs, which):
    return statistics.median(p[which] for p in pairs)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: The schemes ``--fflm`` times by default: the PaTH paper's four, NoPE and ALiBi.
FFLM_SCHEMES = "rope,fox,stickbreaking,path,none,alibi"


def fflm_steps(schemes, repeats=5, lengths=(128, 512, 2048), train_lengths=(512, 128)):
    """Seconds per FFLM training step and per evaluation forward pass, per scheme.

    The model is the ``fflm`` preset's (``posenc.lab.PRESETS["fflm"]``), trained by
    ``posenc.lab.train`` on FFL(0.8) at the preset's batch and each of ``train_lengths``
    tokens (512: ``fflm``, 128: ``fflm-length``), one step per call (one warm-up
    call first); the evaluation is one forward pass without
    gradients over ``8192 // length`` sequences of each of ``lengths`` tokens, the
    batches :func:`posenc.lab.flipflop.fflm` scores.  Returns one dict per scheme:
    ``scheme``, ``parameters``, ``step_s`` (``{train length: median seconds}``),
    ``step_s_all`` (every repeat) and ``forward_8192_tokens_s`` (``{length: seconds}``).
    """
    from posenc.lab.fflm import FlipFlopTask

    config = lab.PRESETS["fflm"]
    task = FlipFlopTask(config.fflm_p_ignore)
    length = config.fflm_train_len - 1
    rows = []
    for scheme in schemes:
        torch.manual_seed(0)
        model = lab.TinyDecoder(
            task.vocab, scheme, length, d_model=config.d_model, layers=config.layers,
            heads=config.heads, rope_base=config.rope_base,
            table_len=max(lengths) if scheme == "learned" else None,
        )  # fmt: skip

        steps = {}
        for n in train_lengths:

            def step(n=n, model=model):
                lab.train(model, task, length=n - 1, steps=1, batch=config.fflm_batch,
                          lr=config.fflm_lr, warmup=1)  # fmt: skip

            step()  # warm-up
            steps[n] = [_time(step, 1) for _ in range(repeats)]
        forward = {}
        for n in lengths:
            x, _, _ = task.batch(max(1, 8192 // n), n - 1, torch.Generator().manual_seed(1))
            with torch.no_grad():
                model(x[:2])  # warm-up
                forward[n] = round(_time(lambda x=x, model=model: model(x), 1), 3)
        rows.append({
            "scheme": scheme, "parameters": sum(p.numel() for p in model.parameters()),
            "step_s": {n: round(statistics.median(t), 3) for n, t in steps.items()},
            "step_s_all": {n: [round(x, 3) for x in t] for n, t in steps.items()},
            "forward_8192_tokens_s": forward,
        })  # fmt: skip
        print(f"{scheme:14s} step {rows[-1]['step_s']} s  forward {forward}", flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--schemes", default=None, help="a,b or 'all'; default: none,sinusoidal,"
                   f"rope,alibi,t5 (with --fflm: {FFLM_SCHEMES})")  # fmt: skip
    p.add_argument("--fflm", action="store_true", help="time the flip-flop model instead")
    p.add_argument("--fflm-lengths", default="128,512,2048", help="evaluation lengths (--fflm)")
    p.add_argument("--no-compiled", action="store_true", help="time the eager step only")
    p.add_argument("--out", default=None, help="store the results as JSON in this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.fflm:
        return _main_fflm(args)
    args.schemes = args.schemes or "none,sinusoidal,rope,alibi,t5"
    load_start = os.getloadavg()
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    cached = sum(len(files) for _, _, files in os.walk(cache_dir()))  # compile times: cold?
    config = lab.PRESETS["full"]
    names = list(posenc.SCHEMES) if args.schemes == "all" else args.schemes.split(",")
    base, base_flops = _matmul_fn(config)
    steps = {s: _step_fn(s, config) for s in names}
    loops = {s: _loop_fn(s, config, 20) for s in steps}
    fast, fast_loops, compile_seconds, kinds = {}, {}, {}, {}
    for s in [] if args.no_compiled else names:
        # the first two steps compile (wall clock: the compile workers are other
        # processes); the loop's model has the same structure and reuses the graph
        fast[s] = _fast_step_fn(s, config)
        start = time.perf_counter()
        fast[s][0]()
        fast[s][0]()
        compile_seconds[s] = time.perf_counter() - start
        kinds[s] = fast[s][1].kind
        fast_loops[s] = _loop_fn(s, config, 20, compiled=True)
        fast_loops[s]()
        print(f"{s}: {kinds[s]}, compile {compile_seconds[s]:.1f} s", flush=True)
    times = {s: [] for s in steps}
    loop_times = {s: [] for s in steps}
    fast_times = {s: [] for s in fast}
    fast_loop_times = {s: [] for s in fast}
    base_times = []
    for fn, _ in [*steps.values(), (base, 0)]:
        fn()  # warm-up
    from posenc._memory import peak_tensor_mib

    peaks = {s: peak_tensor_mib(fn) for s, (fn, _) in steps.items()}
    fast_peaks = {s: peak_tensor_mib(fn) for s, (fn, _) in fast.items()}
    profiles = {s: _profile(fn) for s, (fn, _) in steps.items()}
    fast_profiles = {s: _profile(fn) for s, (fn, _) in fast.items()}
    parts = []
    first = next(iter(steps))
    for _ in range(args.repeats):
        base_times.append(_times(base, 50))
        for s, (fn, _) in steps.items():
            times[s].append(_times(fn))
            loop_times[s].append(tuple(t / 20 for t in _times(loops[s], 1)))
            if s in fast:
                fast_times[s].append(_times(fast[s][0]))
                fast_loop_times[s].append(tuple(t / 20 for t in _times(fast_loops[s], 1)))
        parts.append(_parts(first, config))
    load_end = os.getloadavg()
    rate = {w: base_flops / _median(base_times, i) for i, w in enumerate(("wall", "cpu"))}
    m, k, n = config.batch * config.train_len, config.d_model, 4 * config.d_model
    print(
        f"plain matmul {m}x{k}x{n} fwd+bwd: {rate['wall'] / 1e9:.2f} GFLOP/s wall clock, "
        f"{rate['cpu'] / 1e9:.2f} GFLOP/s CPU time ({args.threads} thread(s)); load average "
        f"{load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end"
    )
    print("of the matmul's rate, by CPU time (by wall clock in brackets):")
    print(f"{'scheme':15s} {'eager step':>14s} {'fast step':>14s} {'eager loop':>14s} "
          f"{'fast loop':>14s} {'compile s':>9s} {'MiB e/f':>9s}")  # fmt: skip
    rows = []
    for s, (_, flops) in steps.items():
        row = {"scheme": s, "flops_per_step": flops}
        cells = []
        for label, series in (
            ("bare_step", times), ("bare_step_fast", fast_times),
            ("lab_loop", loop_times), ("lab_loop_fast", fast_loop_times),
        ):  # fmt: skip
            if s not in series:
                cells.append(f"{'-':>14s}")
                continue
            wall, cpu = _median(series[s], 0), _median(series[s], 1)
            unit = "ms" if label.startswith("bare") else "ms_per_step"
            row[f"{label}_{unit}"] = round(wall * 1e3, 2)
            row[f"{label}_cpu_{unit}"] = round(cpu * 1e3, 2)
            row[f"{label}_of_matmul"] = round(flops / wall / rate["wall"], 3)
            row[f"{label}_cpu_of_matmul"] = round(flops / cpu / rate["cpu"], 3)
            cells.append(f"{flops / cpu / rate['cpu']:6.2f} ({flops / wall / rate['wall']:4.2f})")
        if s in fast:
            row.update(
                fast_step=kinds[s], compile_seconds=round(compile_seconds[s], 1),
                peak_tensor_mib_fast=round(fast_peaks[s], 1),
                fast_matrix_product_share=fast_profiles[s]["matrix_product_share"],
            )  # fmt: skip
        row.update(peak_tensor_mib=round(peaks[s], 1), **profiles[s])
        mib = f"{peaks[s]:.0f}/{fast_peaks[s]:.0f}" if s in fast else f"{peaks[s]:.0f}"
        comp = f"{compile_seconds[s]:9.1f}" if s in fast else f"{'-':>9s}"
        print(f"{s:15s} {' '.join(cells)} {comp} {mib:>9s}")
        rows.append(row)
    extra = {k: round(statistics.median(p[k] for p in parts) * 1e3, 3) for k in parts[0]}
    print(f"lab loop extras for {first} (ms per step): {extra}")
    if args.out:
        result = {
            "benchmark": "bench_lab.py",
            "workload": f"one training step of the lab's TinyDecoder, full preset (batch "
            f"{config.batch}, length {config.train_len}, width {config.d_model}, "
            f"{config.layers} layers, {config.heads} heads), eager and compiled "
            f"(train(compiled=True)), against a plain matmul {m}x{k}x{n}",
            "machine": {
                "cpu": _cpu(), "cores": os.cpu_count(), "torch": torch.__version__,
                "threads": args.threads, "load_average_1_5_15": [round(x, 2) for x in load_start],
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            },
            "load_average_at_end": [round(x, 2) for x in load_end],
            "repeats": args.repeats,
            "inductor_cache_files_at_start": cached,
            "matmul_gflops": round(rate["wall"] / 1e9, 2),
            "matmul_gflops_cpu_time": round(rate["cpu"] / 1e9, 2),
            "rows": rows,
            "lab_loop_extras_ms_per_step": {"scheme": first, **extra},
        }  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"stored: {args.out}")


def _main_fflm(args):
    load_start = os.getloadavg()
    config = lab.PRESETS["fflm"]
    lengths = tuple(int(n) for n in args.fflm_lengths.split(","))
    rows = fflm_steps((args.schemes or FFLM_SCHEMES).split(","), args.repeats, lengths)
    if args.out:
        result = {
            "benchmark": "bench_lab.py --fflm",
            "workload": f"one step of posenc.lab.train on FFL({config.fflm_p_ignore}) with the "
            f"fflm preset's model ({config.layers} layer, {config.heads} heads, width "
            f"{config.d_model}), batch {config.fflm_batch}, {config.fflm_train_len} tokens "
            f"({config.fflm_train_len - 1} inputs), and at 128 tokens (fflm-length); median of "
            f"{args.repeats} steps after one warm-up step; and one forward pass over 8192 "
            f"tokens at each of {list(lengths)} tokens",
            "machine": {
                "cpu": _cpu(), "cores": os.cpu_count(), "torch": torch.__version__,
                "threads": args.threads, "load_average_1_5_15": [round(x, 2) for x in load_start],
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            },
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "repeats": args.repeats,
            "rows": rows,
        }  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"stored: {args.out}")


if __name__ == "__main__":
    main()
