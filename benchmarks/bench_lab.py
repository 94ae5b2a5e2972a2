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

Run: ``python benchmarks/bench_lab.py [--repeats N] [--threads T] [--schemes a,b]
[--out FILE]``.  It prints numbers and, with ``--out``, stores them as JSON with the
CPU, thread count and load average (``benchmarks/results/lab_throughput.json``).
Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

import posenc.lab as lab


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


def _matmul_fn(config):
    m, k, n = config.batch * config.train_len, config.d_model, 4 * config.d_model
    a = torch.randn(m, k, requires_grad=True)
    b = torch.randn(k, n, requires_grad=True)

    def step():
        (a @ b).sum().backward()

    return step, 6 * m * k * n


def _loop_fn(scheme, config, steps, task=None):
    task, model = _model(scheme, config, task)

    def run():
        lab.train(model, task, length=config.train_len, steps=steps, batch=config.batch, lr=1e-3)

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
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--schemes", default="none,sinusoidal,rope,alibi,t5")
    p.add_argument("--out", default=None, help="store the results as JSON in this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    config = lab.PRESETS["full"]
    base, base_flops = _matmul_fn(config)
    steps = {s: _step_fn(s, config) for s in args.schemes.split(",")}
    loops = {s: _loop_fn(s, config, 20) for s in steps}
    times = {s: [] for s in steps}
    loop_times = {s: [] for s in steps}
    base_times = []
    for fn, _ in [*steps.values(), (base, 0)]:
        fn()  # warm-up
    from posenc._memory import peak_tensor_mib

    peaks = {s: peak_tensor_mib(fn) for s, (fn, _) in steps.items()}
    profiles = {s: _profile(fn) for s, (fn, _) in steps.items()}
    parts = []
    first = next(iter(steps))
    for _ in range(args.repeats):
        base_times.append(_time(base, 50))
        for s, (fn, _) in steps.items():
            times[s].append(_time(fn))
            loop_times[s].append(_time(loops[s], 1) / 20)
        parts.append(_parts(first, config))
    rate = base_flops / statistics.median(base_times)
    m, k, n = config.batch * config.train_len, config.d_model, 4 * config.d_model
    print(f"plain matmul {m}x{k}x{n} fwd+bwd: {rate / 1e9:.2f} GFLOP/s ({args.threads} thread(s))")
    print(f"{'scheme':14s} {'bare step':>10s} {'of matmul':>10s} {'lab loop':>10s} "
          f"{'of matmul':>10s} {'peak MiB':>9s} {'in products':>12s}")  # fmt: skip
    rows = []
    for s, (_, flops) in steps.items():
        t, t_loop = statistics.median(times[s]), statistics.median(loop_times[s])
        share = profiles[s]["matrix_product_share"]
        print(f"{s:14s} {t * 1e3:7.1f} ms {flops / t / rate:10.0%} {t_loop * 1e3:7.1f} ms "
              f"{flops / t_loop / rate:10.0%} {peaks[s]:9.1f} {share:12.0%}")  # fmt: skip
        rows.append({
            "scheme": s, "flops_per_step": flops, "bare_step_ms": round(t * 1e3, 2),
            "bare_step_of_matmul": round(flops / t / rate, 3),
            "lab_loop_ms_per_step": round(t_loop * 1e3, 2),
            "lab_loop_of_matmul": round(flops / t_loop / rate, 3),
            "peak_tensor_mib": round(peaks[s], 1), **profiles[s],
        })  # fmt: skip
    extra = {k: round(statistics.median(p[k] for p in parts) * 1e3, 3) for k in parts[0]}
    print(f"lab loop extras for {first} (ms per step): {extra}")
    if args.out:
        result = {
            "benchmark": "bench_lab.py",
            "workload": f"one training step of the lab's TinyDecoder, full preset (batch "
            f"{config.batch}, length {config.train_len}, width {config.d_model}, "
            f"{config.layers} layers, {config.heads} heads), against a plain matmul {m}x{k}x{n}",
            "machine": {
                "cpu": _cpu(), "cores": os.cpu_count(), "torch": torch.__version__,
                "threads": args.threads, "load_average_1_5_15": [round(x, 2) for x in load_start],
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            },
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "repeats": args.repeats,
            "matmul_gflops": round(rate / 1e9, 2),
            "rows": rows,
            "lab_loop_extras_ms_per_step": {"scheme": first, **extra},
        }  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"stored: {args.out}")


if __name__ == "__main__":
    main()
