"""Command line of the length-extrapolation lab.

    python -m posenc.lab --seeds 0-4 --jobs 2     # every experiment, 5 seeds, preset "full"
    python -m posenc.lab --preset smoke           # the reduced run the tests repeat
    python -m posenc.lab --experiments passkey,rope_scaling --threads 2
    python -m posenc.lab --compare                # exit 1 unless the stored results reproduce
    python -m posenc.lab --check DIR              # verdicts of the propositions for DIR's results
    python -m posenc.lab --check --split confirmation  # the same for the stored confirmation set
    python -m posenc.lab --merge A.json B.json --out DIR  # one results file from runs in parts
    torchrun --nproc-per-node 2 -m posenc.lab ... # DistributedDataParallel training

Writes ``<out>/<preset>.json`` (``<preset>-confirmation.json`` with ``--split
confirmation``) and one PNG per experiment (``--no-plots`` to skip; plots need
matplotlib), shows tqdm progress bars (``--no-progress`` to hide them) and
prints the wall-clock time and peak memory.  While it runs, what is finished
is kept in ``<out>/<file>.partial.json``: a run that fails or is stopped keeps
every finished experiment (one process) or seed (``--jobs``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from . import (
    DESCRIPTIONS,
    EXPERIMENTS,
    PRESETS,
    RESULTS_DIR,
    SPLITS,
    compare,
    format_seeds,
    load_results,
    merge,
    parse_seeds,
    results_path,
    run_all,
)  # fmt: skip
from .experiments import PRESET_EXPERIMENTS
from .lab import LabConfig
from .model import check_scheme
from .propositions import PROPOSITIONS, format_verdicts
from .replication import DECLARED_SEEDS, WITHDRAWN, replication_tally
from .train import peak_memory_mb
from .verdicts import _freeze as freeze
from .verdicts import check, propositions_for


def _experiments(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in EXPERIMENTS:
            raise argparse.ArgumentTypeError(
                f"experiments must be names from {', '.join(EXPERIMENTS)}, got {n!r}"
            )
    return names


def _seeds(text: str) -> list[int]:
    try:
        return parse_seeds(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}")
        return value

    return parse


def _schemes(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    try:
        if not names:
            raise ValueError(f"schemes must name at least one scheme, got {text!r}")
        return tuple(check_scheme(n) for n in names)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


#: Exit statuses of ``--check`` (argparse's own errors exit 2 as well).
CHECK_HOLDS = 0  # every claim the chapter states holds, and no frozen stated claim failed
CHECK_FAILS = 1  # a claim the chapter states does not hold (or has no rows)
CHECK_REFUSED = 2  # the file is not what --preset and --split say it is
CHECK_WITHDRAWN = 3  # what the chapter states holds; frozen stated claims failed here

# the presets of the fourth freeze (posenc.lab.recipe_propositions): gains, one family each
RECIPE_PRESETS = ("recall-recipe", "lm-budget")


def _settings_of(config: dict[str, Any]) -> list[str]:
    """The presets whose settings the stored ``config`` has (its schemes and seed aside)."""
    try:
        stored = LabConfig.from_dict(config)
    except (TypeError, ValueError):
        return []
    return [
        name
        for name, preset in PRESETS.items()
        if dataclasses.replace(
            stored, schemes=preset.schemes, passkey_schemes=preset.passkey_schemes, seed=preset.seed
        )
        == preset
    ]


def _refusal(results: dict[str, Any], preset: str, split: str, path: Path) -> str | None:
    """Why ``results`` cannot be checked as ``preset``'s ``split``, or ``None``."""
    config = results.get("config")
    matches = _settings_of(config) if isinstance(config, dict) else []
    if matches and preset not in matches:
        return (f"{path} holds a run of preset {' or '.join(map(repr, matches))} (its config), "
                f"not of --preset {preset!r}: check it with --preset {matches[0]}")  # fmt: skip
    declared = DECLARED_SEEDS.get(preset, {}).get(split)
    seeds = results.get("seeds")
    if declared is not None and isinstance(seeds, list):
        alien = sorted(set(seeds) - set(declared))
        if alien:
            return (f"{path} holds seeds {alien} that the freeze of preset {preset!r} did not "
                    f"declare for its {split} set ({format_seeds(declared)}): a file saved "
                    f"under the wrong --split cannot be checked as that split")  # fmt: skip
    return None


def _print_check(results: dict[str, Any], preset: str, split: str, path: Path) -> int:
    """Print the verdicts of ``results`` (read from ``path``); the exit status (CHECK_*)."""
    rows = results.get("results")
    if not isinstance(rows, dict) or not any(isinstance(v, list) and v for v in rows.values()):
        print(f"{path} holds no result rows: nothing can hold (a run's output has "
              "'results': {experiment: [rows]})")  # fmt: skip
        return CHECK_FAILS
    refusal = _refusal(results, preset, split, path)
    if refusal is not None:
        print(f"refused: {refusal}")
        return CHECK_REFUSED
    smoke = preset == "smoke"
    propositions = PROPOSITIONS if smoke else propositions_for(preset)
    verdicts = check(results, propositions)
    frozen = freeze("full" if smoke else preset)  # the module that froze them
    print(f"propositions: posenc/lab/{Path(frozen.__file__).name}, sha256 {frozen.frozen_hash()}")
    print(f"results: {path}, seeds {results.get('seeds')}")
    declared = DECLARED_SEEDS.get(preset, {}).get(split, ())
    missing = sorted(set(declared) - set(results.get("seeds") or ()))
    if missing:  # e.g. a merge of the parts run so far: its verdicts are not the freeze's
        print(f"partial: the freeze declared seeds {format_seeds(declared)} for its {split} "
              f"set; {len(missing)} of them are missing here ({missing}), so these verdicts "
              "and the tally below are not the freeze's outcome")  # fmt: skip
    print("rules: effect 95% t-interval vs threshold; equivalence 90% t-interval within the "
          "margin (TOST); rate: seeds passing, 95% Clopper-Pearson vs 1/2")  # fmt: skip
    if preset in RECIPE_PRESETS:
        print("       gain: 95% t-interval vs the smallest gain of interest (0.05), the exact "
              "Wilcoxon test agreeing at 5%")  # fmt: skip
        family = "every proposition of the preset, stated and reported"
    else:
        family = "the stated, or the reported, propositions of one preset"
    print(f"columns: verdict, verdict after Holm's correction (family: {family}), name, "
          "interval")  # fmt: skip
    print(format_verdicts(verdicts))
    if smoke:
        print(f"(the chapter states its propositions for the full, recall and recall-warmup "
              f"presets, not {preset!r}: the smoke preset tests the plumbing)")  # fmt: skip
        return CHECK_HOLDS
    # the pre-registered outcome: every frozen stated claim, withdrawn or not
    tally = replication_tally(verdicts)
    print(f"replicated: {tally['replicated']} of {tally['stated']} stated claims of the freeze "
          f"({tally['replicated_holm']} of {tally['stated']} after Holm's correction)")  # fmt: skip
    # what the chapter states: the frozen stated claims, less those its confirmation
    # seeds did not replicate (posenc.lab.replication)
    withdrawn = WITHDRAWN.get(preset, {})  # a freeze not yet confirmed withdrew nothing
    stated = [p for p in propositions if p.stated is not None and p.name not in withdrawn]
    by_name = {v["name"]: v for v in verdicts}
    for name, why in withdrawn.items():
        v = by_name.get(name)
        here = "no rows" if v is None else v["verdict"]
        print(f"withdrawn   {name}: {why}; here: {here}")
    failed = 0
    for p in stated:
        v = by_name.get(p.name)
        if v is None or v["verdict"] == "no rows":
            absent = [e for e in p.experiments if not rows.get(e)]
            where = f" (experiment {', '.join(absent)} missing)" if absent else ""
            print(f"NOT HOLDING {p.name}: no rows for it in {path}{where}")
        elif v["verdict"] != p.stated:
            print(f"NOT HOLDING {p.name}: {v['verdict']} (stated: {p.stated}), "
                  f"values {v['values']}")  # fmt: skip
        else:
            continue
        failed += 1
    counts = f"{len(stated)} stated, {len(withdrawn)} withdrawn after the confirmation runs"
    if split == "discovery":
        print("(these are discovery seeds, which chose the stated verdicts: only the "
              "confirmation split tests them)")  # fmt: skip
    if failed:
        print(f"{failed} stated propositions do not hold as stated ({counts})")
        if split == "discovery":
            print("(expected on the stored discovery seeds: five seeds cannot decide a rate, "
                  "since 5 of 5 gives [0.48, 1], and the recall discovery runs predate the "
                  "frozen recall measure, so they have no rows for it)")  # fmt: skip
        return CHECK_FAILS
    print(f"every proposition the chapter states holds ({counts})")
    if split == "confirmation" and tally["failed"]:
        names = ", ".join(tally["failed"])
        print(f"exit {CHECK_WITHDRAWN}: {len(tally['failed'])} frozen stated claims did not "
              f"replicate here ({names}); the chapter withdrew them")  # fmt: skip
        return CHECK_WITHDRAWN
    return CHECK_HOLDS


def _load(path: Path) -> dict[str, Any]:
    try:
        out = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"{path} cannot be read: {err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{path} is not a complete lab results file (truncated or corrupted: {err})"
        ) from None
    if not isinstance(out, dict) or "config" not in out:
        raise ValueError(f"{path} must hold a run's output (config, seeds, results, meta)")
    return out


def main(argv: Sequence[str] | None = None) -> int:
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
    p.add_argument(
        "--schemes",
        type=_schemes,
        default=None,
        help="comma-separated scheme names (default: the preset's)",
    )
    p.add_argument("--seeds", type=_seeds, default=None, help="e.g. 0-4 or 0,3 (default: 0)")
    p.add_argument(
        "--seed", type=_seeds, default=None, help="one seed (same as --seeds N; not with --seeds)"
    )
    p.add_argument("--jobs", type=_positive("--jobs"), default=1, help="seeds run in parallel")
    p.add_argument("--threads", type=_positive("--threads"), default=1, help="torch threads")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda where CUDA is present")
    p.add_argument("--out", type=Path, default=Path("lab-results"), help="output directory")
    p.add_argument(
        "--split",
        choices=SPLITS,
        default="discovery",
        help="which set of seeds the results are: names the output file (<preset>.json or "
        "<preset>-confirmation.json) and the file --check reads",
    )
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
        nargs="?",
        const=RESULTS_DIR,
        default=None,
        metavar="DIR",
        help="print the verdicts of the propositions for DIR's results of --preset and --split "
        "(DIR defaults to the stored results), with the tally of the freeze's stated claims "
        "that replicated, and exit: 1 if a proposition the chapter states (a frozen one, less "
        "those withdrawn after the confirmation runs, which it lists) does not have its "
        "stated verdict, or has no rows; 2 if the file's config or seeds are not --preset's "
        "and --split's; 3 if what the chapter states holds but a frozen stated claim failed "
        "on these confirmation seeds; else 0",
    )
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        metavar="FILE",
        help="merge results files of one preset, run in parts (other seeds, schemes or "
        "experiments), into --out's file for --preset and --split, and exit",
    )
    args = p.parse_args(argv)
    if args.device != "cpu" and not (args.device.startswith("cuda") and torch.cuda.is_available()):
        p.error(f"--device must be 'cpu' or 'cuda' with CUDA present, got {args.device!r}")
    if args.seed is not None and args.seeds is not None:
        p.error("--seed and --seeds name the seeds twice: give one of them (--seeds N for one)")
    if args.seed is not None and len(args.seed) != 1:
        p.error(f"--seed must be one seed (use --seeds for several), got {args.seed}")
    if args.check is not None:
        judged = sorted({*WITHDRAWN, *RECIPE_PRESETS, "smoke"})
        if args.preset not in judged:  # nothing is stated about it: a check would pass on nothing
            p.error(
                f"--check needs a preset the propositions are about ({', '.join(judged)}), "
                f"got {args.preset!r}: read its verdicts with posenc.lab.check"
            )
        try:
            results = load_results(args.preset, args.check, args.split)
        except ValueError as err:
            p.error(str(err))
        path = results_path(args.preset, args.check, args.split)
        return _print_check(results, args.preset, args.split, path)
    path = results_path(args.preset, args.out, args.split)
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out must name a directory (results go in --out/{path.name}); "
                f"{args.out} is an existing file")  # fmt: skip
    if path.is_dir():
        p.error(f"--out must not hold a directory named {path.name}, the results file")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        p.error(f"--out must be a directory that can be created: {err}")
    if not os.access(args.out, os.W_OK):
        p.error(f"--out must be writable, got {args.out}")
    if args.merge is not None:
        try:
            merged = merge(*(_load(f) for f in args.merge))
        except ValueError as err:
            p.error(str(err))
        merged["meta"]["merged_from"] = [str(f) for f in args.merge]
        path.write_text(json.dumps(merged, indent=1) + "\n")
        print(f"merged {len(args.merge)} files ({len(merged['seeds'])} seeds): {path}")
        return 0
    torch.set_num_threads(args.threads)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: DDP training (train())
        torch.distributed.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
        if torch.distributed.get_rank() != 0:  # every process evaluates; rank 0 reports
            args.no_plots, args.compare, args.no_progress = True, False, True
            args.out = args.out / f"rank{torch.distributed.get_rank()}"
    config = PRESETS[args.preset]
    if args.schemes is not None:
        config = dataclasses.replace(config, schemes=args.schemes, passkey_schemes=None,
                                     recall_schemes=())  # fmt: skip
    seeds = args.seeds if args.seed is None else args.seed
    partial = path.with_name(path.stem + ".partial.json")
    command = "python -m posenc.lab " + " ".join(sys.argv[1:] if argv is None else argv)

    def save(output: dict[str, Any]) -> None:
        output["meta"].update(command=command, complete=False)
        partial.write_text(json.dumps(output, indent=1) + "\n")

    start = time.perf_counter()
    out = run_all(
        config,
        args.experiments or PRESET_EXPERIMENTS[args.preset],
        seeds=seeds,
        jobs=args.jobs,
        device=args.device,
        progress=not args.no_progress and args.jobs == 1,
        log=print,
        save=save,
    )
    total = time.perf_counter() - start
    out["meta"]["total_seconds"] = round(total, 1)
    out["meta"]["threads"] = args.threads
    out["meta"]["command"] = command
    if out["meta"].get("errors"):
        save(out)
        for line in out["meta"]["errors"]:
            print("FAILED", line)
        print(f"run failed; every finished experiment is kept in {partial}")
        return 1
    path.write_text(json.dumps(out, indent=1) + "\n")
    partial.unlink(missing_ok=True)
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

        # the passkey figure pools every answer, so it needs how many each accuracy is over
        extra = {"passkey": {"sequences": config.passkey_sequences}}
        for name, rows in out["results"].items():
            if not rows:  # an opt-in experiment its settings left off: nothing to draw
                continue
            fig = FIGURES[name](out["results"], **extra.get(name, {}))
            fig.savefig(args.out / f"{args.preset}_{name}.png", dpi=100)
        print(f"plots: {args.out}/{args.preset}_*.png")
    return status


if __name__ == "__main__":
    sys.exit(main())
