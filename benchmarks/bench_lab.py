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
the learning-rate schedule), timed over the same number of steps.  Peak
memory is the tensor memory held during one bare step
(``posenc._memory.peak_tensor_mib``).

Run: ``python benchmarks/bench_lab.py [--repeats N] [--threads T] [--schemes a,b]``.
It prints numbers only; nothing here is a test.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import posenc.lab as lab


def _model(scheme, config):
    """``(task, model)``: the language task and a fresh TinyDecoder at the config's sizes."""
    task = lab.LanguageTask()
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


def _loop_fn(scheme, config, steps):
    task, model = _model(scheme, config)

    def run():
        lab.train(model, task, length=config.train_len, steps=steps, batch=config.batch, lr=1e-3)

    return run


def _time(fn, inner=5):
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--schemes", default="none,sinusoidal,rope,alibi,t5")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
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
    for _ in range(args.repeats):
        base_times.append(_time(base, 50))
        for s, (fn, _) in steps.items():
            times[s].append(_time(fn))
            loop_times[s].append(_time(loops[s], 1) / 20)
    rate = base_flops / statistics.median(base_times)
    print(f"plain matmul {config.batch * config.train_len}x{config.d_model}x{4 * config.d_model} "
          f"fwd+bwd: {rate / 1e9:.2f} GFLOP/s ({args.threads} thread(s))")  # fmt: skip
    print(f"{'scheme':12s} {'bare step':>10s} {'of matmul':>10s} {'lab loop':>10s} "
          f"{'of matmul':>10s} {'peak MiB':>9s}")  # fmt: skip
    for s, (_, flops) in steps.items():
        t, t_loop = statistics.median(times[s]), statistics.median(loop_times[s])
        print(f"{s:12s} {t * 1e3:7.1f} ms {flops / t / rate:10.0%} {t_loop * 1e3:7.1f} ms "
              f"{flops / t_loop / rate:10.0%} {peaks[s]:9.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
