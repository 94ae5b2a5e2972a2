"""Command line of the length-extrapolation lab.

    python -m posenc.lab                       # every experiment, preset "full"
    python -m posenc.lab --preset smoke        # the reduced run the tests repeat
    python -m posenc.lab --experiments passkey,rope_scaling --threads 2
    python -m posenc.lab --compare             # exit 1 unless the stored results reproduce

Writes ``<out>/<preset>.json`` and one PNG per experiment (``--no-plots`` to
skip), shows tqdm progress bars (``--no-progress`` to hide them) and prints
the wall-clock time and peak memory of each experiment.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from . import EXPERIMENTS, PRESETS, RESULTS_DIR, compare, run_all
from .train import peak_memory_mb


def _experiments(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in EXPERIMENTS:
            raise argparse.ArgumentTypeError(
                f"experiments must be names from {', '.join(EXPERIMENTS)}, got {n!r}"
            )
    return names


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m posenc.lab", description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="full")
    p.add_argument(
        "--experiments", type=_experiments, default=None, help="comma-separated; default: all"
    )
    p.add_argument("--seed", type=int, default=None, help="overrides the preset's seed (0)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", type=Path, default=Path("lab-results"), help="output directory")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--compare",
        action="store_true",
        help="compare with the stored results in posenc/lab/results/ and exit 1 on a mismatch",
    )
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error(f"--threads must be a positive integer, got {args.threads}")
    torch.set_num_threads(args.threads)
    config = PRESETS[args.preset]
    if args.seed is not None:
        config = dataclasses.replace(config, seed=args.seed)
    start = time.perf_counter()
    out = run_all(config, args.experiments, progress=not args.no_progress, log=print)
    total = time.perf_counter() - start
    out["meta"]["total_seconds"] = round(total, 1)
    out["meta"]["threads"] = args.threads
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.preset}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    peak = peak_memory_mb()
    print(f"total: {total:.1f} s with {args.threads} thread(s); peak memory {peak:.0f} MiB")
    print(f"results: {path}")
    if not args.no_plots:
        import matplotlib

        matplotlib.use("Agg")
        from .plots import FIGURES

        for name in out["results"]:
            fig = FIGURES[name](out["results"])
            fig.savefig(args.out / f"{args.preset}_{name}.png", dpi=100)
        print(f"plots: {args.out}/{args.preset}_*.png")
    if args.compare:
        stored = json.loads((RESULTS_DIR / f"{args.preset}.json").read_text())
        problems = compare(stored, out)
        for line in problems:
            print("MISMATCH", line)
        print("stored results reproduced" if not problems else f"{len(problems)} mismatches")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
