"""Command line of the length-extrapolation lab.

    python -m posenc.lab --seeds 0-4 --jobs 2     # every experiment, 5 seeds, preset "full"
    python -m posenc.lab --preset smoke           # the reduced run the tests repeat
    python -m posenc.lab --experiments passkey,rope_scaling --threads 2
    python -m posenc.lab --compare                # exit 1 unless the stored results reproduce
    python -m posenc.lab --check DIR              # verdicts of the propositions for DIR's results
    torchrun --nproc-per-node 2 -m posenc.lab ... # DistributedDataParallel training

Writes ``<out>/<preset>.json`` and one PNG per experiment (``--no-plots`` to
skip; plots need matplotlib), shows tqdm progress bars (``--no-progress`` to
hide them) and prints the wall-clock time and peak memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from . import DESCRIPTIONS, EXPERIMENTS, PRESETS, compare, load_results, run_all
from .experiments import PRESET_EXPERIMENTS
from .propositions import check, failures, format_verdicts
from .train import peak_memory_mb


def _experiments(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in EXPERIMENTS:
            raise argparse.ArgumentTypeError(
                f"experiments must be names from {', '.join(EXPERIMENTS)}, got {n!r}"
            )
    return names


def _seeds(text: str) -> list[int]:
    from .run import parse_seeds

    try:
        return parse_seeds(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive(name):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}")
        return value

    return parse


def _print_check(results: dict, preset: str) -> int:
    verdicts = check(results)
    print(f"propositions ({len(results.get('seeds', [None]))} seeds, 95% t-interval over seeds):")
    print(format_verdicts(verdicts))
    bad = failures(verdicts)
    if preset == "smoke":
        print(f"(the chapter states its propositions for the full preset, not {preset!r})")
        return 0
    for v in bad:
        print(f"NOT HOLDING {v['name']}: {v['verdict']}, values {v['values']}")
    print("every stated proposition holds" if not bad else f"{len(bad)} stated propositions fail")
    return 1 if bad else 0


def main(argv=None) -> int:
    own = set(PRESET_EXPERIMENTS["recall"])  # not in the full preset: --preset recall runs them
    listing = "\n".join(
        f"  {name:14s} {text}" + (" [--preset recall]" if name in own else "")
        for name, text in DESCRIPTIONS.items()
    )
    p = argparse.ArgumentParser(
        prog="python -m posenc.lab",
        description=__doc__.split("\n")[0],
        epilog=f"experiments:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="full")
    p.add_argument(
        "--experiments",
        type=_experiments,
        default=None,
        help="comma-separated; default: the preset's (full: all but recall and needle_grid, "
        "which are the recall preset's; smoke: all)",
    )
    p.add_argument("--seeds", type=_seeds, default=None, help="e.g. 0-4 or 0,3 (default: 0)")
    p.add_argument("--seed", type=int, default=None, help="one seed (same as --seeds N)")
    p.add_argument("--jobs", type=_positive("--jobs"), default=1, help="seeds run in parallel")
    p.add_argument("--threads", type=_positive("--threads"), default=1, help="torch threads")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda where CUDA is present")
    p.add_argument("--out", type=Path, default=Path("lab-results"), help="output directory")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--compare",
        action="store_true",
        help="compare with the stored results (statistically, see posenc.lab.TOLERANCE); "
        "exit 1 on a mismatch",
    )
    p.add_argument(
        "--check",
        type=Path,
        default=None,
        metavar="DIR",
        help="print the verdicts of the propositions for DIR/<preset>.json and exit "
        "(1 if a proposition the chapter states as holding does not hold)",
    )
    args = p.parse_args(argv)
    if args.device != "cpu" and not (args.device.startswith("cuda") and torch.cuda.is_available()):
        p.error(f"--device must be 'cpu' or 'cuda' with CUDA present, got {args.device!r}")
    if args.check is not None:
        try:
            results = load_results(args.preset, args.check)
        except ValueError as err:
            p.error(str(err))
        return _print_check(results, args.preset)
    torch.set_num_threads(args.threads)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: DDP training (train())
        torch.distributed.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
        if torch.distributed.get_rank() != 0:  # every process evaluates; rank 0 reports
            args.no_plots, args.compare, args.no_progress = True, False, True
            args.out = args.out / f"rank{torch.distributed.get_rank()}"
    config = PRESETS[args.preset]
    seeds = args.seeds
    if args.seed is not None:
        config = dataclasses.replace(config, seed=args.seed)
    start = time.perf_counter()
    out = run_all(
        config,
        args.experiments or PRESET_EXPERIMENTS[args.preset],
        seeds=seeds,
        jobs=args.jobs,
        device=args.device,
        progress=not args.no_progress and args.jobs == 1,
        log=print,
    )
    total = time.perf_counter() - start
    out["meta"]["total_seconds"] = round(total, 1)
    out["meta"]["threads"] = args.threads
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.preset}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    peak = max(peak_memory_mb(), out["meta"]["peak_memory_mb"])
    print(
        f"total: {total:.1f} s, {len(out['seeds'])} seed(s), {args.jobs} job(s), "
        f"{args.threads} thread(s); peak memory {peak:.0f} MiB (per process)"
    )
    print(f"results: {path}")
    status = 0
    if args.compare:  # the verdict comes before any plotting
        problems = compare(load_results(args.preset), out)
        for line in problems:
            print("MISMATCH", line)
        print("stored results reproduced" if not problems else f"{len(problems)} mismatches")
        status = 1 if problems else 0
    if not args.no_plots:
        try:
            import matplotlib
        except ImportError:
            print("plots skipped: matplotlib is not installed (pip install matplotlib)")
            return status
        matplotlib.use("Agg")
        from .plots import FIGURES

        for name in out["results"]:
            fig = FIGURES[name](out["results"])
            fig.savefig(args.out / f"{args.preset}_{name}.png", dpi=100)
        print(f"plots: {args.out}/{args.preset}_*.png")
    return status


if __name__ == "__main__":
    sys.exit(main())
