"""Running experiments over seeds, and reading the results: means with intervals, comparison.

:func:`run_all` runs experiments for several seeds (in worker processes with
``jobs > 1``); :func:`summarize` averages rows over seeds with a 95%
t-interval; :func:`compare` decides whether a fresh run reproduces a stored one.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import torch

from .._checks import check_choice, check_int
from .experiments import EXPERIMENTS, curse_summary
from .lab import PRESETS, Lab, LabConfig, Row
from .stats import t_interval
from .train import peak_memory_mb

__all__ = [
    "PER_ANSWER", "SETTINGS", "TOLERANCE", "compare", "format_seeds", "merge", "parse_seeds",
    "run_all", "summarize",
]  # fmt: skip

#: A :func:`run_all` output, as stored in a results file: ``config``, ``seeds``,
#: ``results`` (``{experiment: [row, ...]}``) and ``meta`` (JSON: fields of several types).
Output: TypeAlias = dict[str, Any]
#: Seeds as :func:`parse_seeds` takes them: ``"0-4"``, ``"0,2,5"``, one int, or a list.
Seeds: TypeAlias = str | int | list[int] | tuple[int, ...] | range
# What one seed finished: its rows per experiment, and its meta (seconds, memory, error).
_SeedRun: TypeAlias = tuple[dict[str, list[Row]], dict[str, Any]]


def parse_seeds(text: Seeds) -> list[int]:
    """Seeds from ``"0-4"``, ``"0,2,5"``, ``"3"`` or a list; ``ValueError`` naming ``seeds``.

    Parameters
    ----------
    text
        A string of comma-separated seeds and ranges ``lo-hi`` (both ends
        included), one int, or a list, tuple or range of ints.

    Returns
    -------
    The seeds in the order given: distinct non-negative ints, at least one.
    """
    if isinstance(text, (list, tuple, range)):
        seeds = [check_int("seeds", s, minimum=0) for s in text]
    else:
        seeds = []
        for part in str(text).split(","):
            first, sep, last = part.strip().partition("-")
            try:
                lo, hi = int(first), int(last) if sep else int(first)
            except ValueError:
                raise ValueError(
                    f"seeds must be non-negative integers or ranges like '0-4', got {text!r}"
                ) from None
            if lo < 0 or hi < lo:
                raise ValueError(
                    f"seeds must be ranges lo-hi with 0 <= lo <= hi (like '0-4'), got {part!r}"
                )
            seeds += range(lo, hi + 1)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {text!r}")
    return seeds


def format_seeds(seeds: Iterable[int], dash: str = "-") -> str:
    """Seeds as short text, the inverse of :func:`parse_seeds`: ``{0, 1, 2, 3, 4}`` -> ``"0-4"``.

    Parameters
    ----------
    seeds
        Non-negative ints, at least one, in any order; a seed given twice counts once
        (e.g. the seeds of a table's rows).
    dash
        What joins the ends of a run of consecutive seeds: ``"-"`` (the default) gives
        text that :func:`parse_seeds` reads back; the book's prose uses an en dash.  A
        digit or comma is refused (``ValueError``): the text would read as other seeds.

    Returns
    -------
    The seeds in ascending order, each run of three or more consecutive seeds written
    ``lo-hi``, joined by commas: ``{5, 6, 7, 9}`` -> ``"5-7,9"``, ``{3, 4}`` -> ``"3,4"``.

    Examples
    --------
    >>> format_seeds(range(25, 35))
    '25-34'
    >>> format_seeds([9, 5, 6, 7, 7, 11, 12], dash="\u2013")
    '5\u20137,9,11,12'
    """
    if not isinstance(dash, str) or not dash or any(c.isdigit() or c == "," for c in dash):
        # a digit or comma there would make "5,6,7" read as other seeds
        raise ValueError(f"dash must be a non-empty string with no digit or comma, got {dash!r}")
    unique = sorted({check_int("seeds", s, minimum=0) for s in seeds})
    if not unique:
        raise ValueError("seeds must hold at least one seed, got none")
    runs: list[list[int]] = []
    for s in unique:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    parts = []  # a pair reads better as "3,4" than as "3-4"
    for lo, hi in runs:
        parts += [f"{lo}{dash}{hi}"] if hi - lo >= 2 else [str(s) for s in range(lo, hi + 1)]
    return ",".join(parts)


def _run_seed(
    config: LabConfig,
    names: Sequence[str],
    progress: bool = False,
    log: Callable[[str], object] | None = None,
    threads: int | None = None,
    device: str | torch.device = "cpu",
    done: Callable[[dict[str, list[Row]], dict[str, Any]], None] | None = None,
) -> _SeedRun:
    """All ``names`` for one seed: ``(results, meta)``; every row starts with ``seed``.

    ``done(results, meta)``, when given, is called after every experiment with
    what the seed has finished so far.  An experiment that raises leaves
    ``meta["error"]`` (the experiment and the error) and stops the seed: the
    finished experiments are returned.
    """
    if threads is not None:
        torch.set_num_threads(threads)
    lab = Lab(config, progress=progress, device=device)
    results: dict[str, list[Row]] = {}
    meta: dict[str, Any] = {"seconds": {}, "peak_memory_mb": {}}
    for name in names:
        start = time.perf_counter()
        try:
            rows = [{"seed": config.seed, **r} for r in EXPERIMENTS[name](lab)]
        except Exception as err:  # a late failure keeps what the seed finished
            meta["error"] = f"seed {config.seed}, experiment {name}: {type(err).__name__}: {err}"
            if log is not None:
                log(f"FAILED {meta['error']}")
            return results, meta
        results[name] = rows
        meta["seconds"][name] = round(time.perf_counter() - start, 1)
        meta["peak_memory_mb"][name] = round(peak_memory_mb(), 1)
        if log is not None:
            log(
                f"seed {config.seed} {name}: {meta['seconds'][name]:.1f} s, "
                f"peak memory {meta['peak_memory_mb'][name]:.0f} MiB"
            )
        if done is not None:
            done(results, meta)
    return results, meta


def _run_seed_job(
    config_dict: dict[str, Any], names: Sequence[str], threads: int, device: str
) -> _SeedRun:  # top level: picklable for workers
    return _run_seed(LabConfig.from_dict(config_dict), names, threads=threads, device=device)


def run_all(
    config: LabConfig | None = None,
    experiments: Iterable[str] | None = None,
    *,
    seeds: Seeds | None = None,
    jobs: int = 1,
    device: str | torch.device = "cpu",
    progress: bool = False,
    log: Callable[[str], object] | None = None,
    save: Callable[[Output], object] | None = None,
) -> Output:
    """Run ``experiments`` (names from :data:`EXPERIMENTS`; all by default) for every seed.

    A seed whose experiment raises stops there; the others run on.  The output
    then holds every finished experiment of every seed (a seed's rows only for
    the experiments it finished) and ``meta["errors"]`` says what failed.

    Parameters
    ----------
    config
        The settings (default ``PRESETS["full"]``); each seed runs
        ``dataclasses.replace(config, seed=seed)``.
    experiments
        Names from :data:`EXPERIMENTS`, run in this order (default: all).
    seeds
        A list of ints or a string like ``"0-4"`` (:func:`parse_seeds`; default:
        the config's ``seed``).
    jobs
        ``jobs > 1`` runs seeds in that many worker processes, each with
        ``max(1, torch.get_num_threads() // jobs)`` threads; a seed's numbers do
        not depend on the process that ran it.
    device
        Where the models run (``"cpu"``, or ``"cuda"`` where CUDA is present);
        the data is drawn on the CPU, so a seed sees the same data anywhere.
    progress
        Show progress bars while models train (one process only).
    log
        Called (e.g. ``print``) with one line per finished experiment.
    save
        Called with the output so far after every finished experiment (one
        process) or seed (``jobs > 1``), so a run that fails late, or is
        stopped, keeps what it finished.

    Returns
    -------
    ``{"config": ..., "seeds": [...], "results": {name: rows}, "meta": {...}}``:
    one row per seed and observation (``row["seed"]``), seeds in order.
    ``meta`` holds wall-clock seconds and peak memory per seed and experiment
    (they vary from run to run and are never compared).
    """
    config = PRESETS["full"] if config is None else config
    names = list(EXPERIMENTS) if experiments is None else list(experiments)
    for name in names:
        check_choice("experiments", name, EXPERIMENTS)
    seeds = [config.seed] if seeds is None else parse_seeds(seeds)
    jobs = check_int("jobs", jobs, minimum=1)
    configs = [dataclasses.replace(config, seed=s) for s in seeds]
    outs: dict[int, _SeedRun] = {}

    def output() -> Output:
        done = [(c, outs[c.seed]) for c in configs if c.seed in outs]
        results = {n: [r for _, (res, _) in done for r in res.get(n, [])] for n in names}
        meta = {
            "seconds": {str(c.seed): m["seconds"] for c, (_, m) in done},
            "peak_memory_mb": max(
                (max(m["peak_memory_mb"].values(), default=0) for _, (_, m) in done), default=0
            ),
            "jobs": jobs,
            "torch": torch.__version__,
        }
        errors = [m["error"] for _, (_, m) in done if "error" in m]
        if errors:
            meta["errors"] = errors
        return {
            "config": configs[0].to_dict(), "seeds": [c.seed for c, _ in done],
            "results": results, "meta": meta,
        }  # fmt: skip

    def finished(seed: int) -> Callable[[dict[str, list[Row]], dict[str, Any]], None]:
        def done(res: dict[str, list[Row]], meta: dict[str, Any]) -> None:
            outs[seed] = (dict(res), meta)
            if save is not None:
                save(output())

        return done

    if jobs == 1 or len(seeds) == 1:
        for c in configs:
            outs[c.seed] = _run_seed(c, names, progress, log, device=device, done=finished(c.seed))
    else:
        import concurrent.futures as cf
        import multiprocessing as mp

        threads = max(1, torch.get_num_threads() // jobs)
        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = {
                pool.submit(_run_seed_job, c.to_dict(), names, threads, str(device)): c
                for c in configs
            }
            for f in cf.as_completed(futures):
                c = futures[f]
                try:
                    outs[c.seed] = f.result()
                except Exception as err:  # the worker itself died: nothing of this seed
                    outs[c.seed] = (
                        {},
                        {
                            "seconds": {},
                            "peak_memory_mb": {},
                            "error": f"seed {c.seed}: {type(err).__name__}: {err}",
                        },
                    )
                if log is not None:
                    log(f"seed {c.seed}: {sum(outs[c.seed][1]['seconds'].values()):.1f} s")
                if save is not None:
                    save(output())
    return output()


def merge(*outputs: Mapping[str, Any]) -> Output:
    """One :func:`run_all` output from several, run in parts of the same preset.

    The parts differ in their seeds, schemes or experiments.  Configs must agree
    except for ``seed`` and the scheme lists (the merged config lists every
    scheme of any part, in order of appearance).  Rows are concatenated per
    experiment and sorted by seed (stable: each part's order within a seed);
    seeds are the union, sorted.  The same seed, experiment and scheme in two
    parts is an error (``ValueError``), and so is no part at all.  Rows with
    no ``scheme`` (``recall_answers``: a seed's band inputs, the same for every
    scheme) may come from several parts that ran the seed: they are kept once,
    and parts whose rows for that experiment and seed differ are an error.

    Parameters
    ----------
    *outputs
        :func:`run_all` outputs (or results files read with :func:`json.load`).

    Returns
    -------
    One output: ``config``, ``seeds``, ``results``, and ``meta`` whose ``parts``
    keeps every part's meta.
    """
    if not outputs:
        raise ValueError("outputs must hold at least one run_all output")
    lists = ("schemes", "passkey_schemes", "recall_schemes")
    base = {k: v for k, v in outputs[0]["config"].items() if k not in lists + ("seed",)}
    for o in outputs[1:]:
        other = {k: v for k, v in o["config"].items() if k not in lists + ("seed",)}
        if other != base:
            diff = sorted(k for k in set(base) | set(other) if base.get(k) != other.get(k))
            raise ValueError(f"outputs must share one config; they differ in {', '.join(diff)}")
    config = dict(outputs[0]["config"])
    for key in lists:
        config[key] = list(dict.fromkeys(s for o in outputs for s in o["config"].get(key) or []))
    results: dict[str, list[Row]] = {}
    seen: dict[tuple[str, Any, str], int] = {}  # (experiment, seed, scheme) -> part
    shared: dict[tuple[str, Any], list[Row]] = {}  # (experiment, seed) -> rows with no scheme
    for i, o in enumerate(outputs):
        for name, rows in o["results"].items():
            # rows with no scheme (recall_answers: the band inputs of a seed) are the same in
            # every part that ran the seed: kept once, and an error if two parts disagree
            own: dict[Any, list[Row]] = {}
            for r in rows:
                if "scheme" not in r:
                    own.setdefault(r.get("seed"), []).append(r)
            for seed, mine in own.items():
                first = shared.setdefault((name, seed), mine)
                if first is not mine and first != mine:
                    raise ValueError(
                        f"outputs must agree on the rows they share: experiment {name}, "
                        f"seed {seed} differs between parts (run with other settings?)"
                    )
            kept = []
            for r in rows:
                if "scheme" not in r:
                    if shared[name, r.get("seed")] is own[r.get("seed")]:
                        kept.append(r)
                    continue
                owner = (name, r.get("seed"), r["scheme"].split(":")[0])
                if seen.setdefault(owner, i) != i:
                    raise ValueError(
                        f"outputs must not overlap: experiment {name}, seed {owner[1]}, "
                        f"scheme {owner[2] or '-'} is in parts {seen[owner]} and {i}"
                    )
                kept.append(r)
            results.setdefault(name, []).extend(kept)
    for name in results:
        results[name].sort(key=lambda r: r.get("seed", 0))
    seeds = sorted({s for o in outputs for s in o["seeds"]})
    return {
        "config": config, "seeds": seeds, "results": results,
        "meta": {"parts": [o.get("meta", {}) for o in outputs]},
    }  # fmt: skip


#: Float fields that are settings, not measurements: they name an observation (the
#: RoPE base, the ALiBi slope scale, YaRN's beta_fast, the needle's depth).
SETTINGS = ("base", "scale", "beta_fast", "depth", "p_ignore", "lr")

#: Fields that are per-seed measurements but not floats (counts, per-answer records):
#: they never name an observation.
PER_ANSWER = ("answers", "correct", "hits", "distances", "criterion_step", "reads", "errors",
              "sequences")  # fmt: skip


def _group_key(row: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The fields that name an observation: every non-float field and every setting
    (``SETTINGS``), except ``seed`` and the fields of ``PER_ANSWER``."""
    return tuple(
        (k, v)
        for k, v in row.items()
        if k != "seed"
        and k not in PER_ANSWER
        and v is not None
        and (k in SETTINGS or not isinstance(v, float))
    )


def summarize(rows: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Rows averaged over seeds, with a 95% t-interval for every measurement.

    Rows that agree on every field naming an observation (every field that is
    not a float, and the float settings of ``SETTINGS``; ``seed`` and the
    per-answer fields of ``PER_ANSWER`` aside) form one group.

    Parameters
    ----------
    rows
        An experiment's rows, one per seed and observation.

    Returns
    -------
    One row per group, in order of first appearance: the naming fields, then
    for each float field ``x`` (a measurement) its mean ``x`` and ``x_lo``,
    ``x_hi`` (the 95% t-interval of :func:`t_interval` over the seeds where it
    is defined, not ``None``; equal to the mean for one seed), and ``seeds``
    (how many rows).
    """
    groups: dict[tuple[tuple[str, Any], ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(_group_key(r), []).append(r)
    out = []
    for key, rs in groups.items():
        row = dict(key)
        fields = dict.fromkeys(
            k for r in rs for k, v in r.items() if isinstance(v, float) and k not in SETTINGS
        )
        for k in fields:
            vals = [r[k] for r in rs if isinstance(r.get(k), float)]  # None: undefined there
            mean, lo, hi = t_interval(vals)
            row[k], row[f"{k}_lo"], row[f"{k}_hi"] = mean, lo, hi
        row["seeds"] = len(rs)
        out.append(row)
    return out


#: Compared summaries: a fresh mean passes when it lies within ``spread`` times the
#: seed standard deviation of the difference of means, ``sd * sqrt(1/n_stored + 1/n_fresh)``,
#: plus an absolute margin (the evaluation resolution): losses in nats, accuracies as fractions.
TOLERANCE = {"spread": 6.0, "loss": 0.01, "accuracy": 0.05}


def _compared(
    results: Mapping[str, list[Row]],
) -> dict[tuple[str, tuple[tuple[str, Any], ...], str], list[float]]:
    """The summary statistics ``compare`` looks at: ``{(experiment, key, field): [per-seed]}``."""
    out: dict[tuple[str, tuple[tuple[str, Any], ...], str], list[float]] = {}

    def add(name: str, rows: Iterable[Mapping[str, Any]], fields: Iterable[str]) -> None:
        for r in rows:
            for k in fields:
                if isinstance(r.get(k), float):
                    out.setdefault((name, _group_key(r), k), []).append(r[k])

    for name, rows in results.items():
        if name == "training":  # the end of each curve, not every step
            last = max(r["step"] for r in rows)
            add(name, [r for r in rows if r["step"] == last], ("loss",))
        elif name == "early_tokens":
            add(name, curse_summary(rows), ("short", "long", "curse_only", "gain"))
        else:
            add(name, rows, ("loss", "excess", "accuracy", "final_train_loss", "floor"))
    return out


def compare(
    stored: Mapping[str, Any],
    fresh: Mapping[str, Any],
    tolerance: Mapping[str, float] | None = None,
) -> list[str]:
    """Statistical differences between two :func:`run_all` outputs (empty list: they agree).

    For every summary statistic (loss, excess and accuracy rows; the last
    training loss; the early-token summary), the mean over ``fresh``'s seeds
    must lie within ``tolerance["spread"]`` standard errors of the difference
    of means (the standard deviation over ``stored``'s seeds, or over
    ``fresh``'s when ``stored`` has one seed) plus an absolute margin
    (``tolerance["loss"]`` nats or ``["accuracy"]``): see :data:`TOLERANCE`.
    So another CPU, thread count or set of seeds passes unless the
    difference is far outside the seed-to-seed spread.  The entropy floor,
    which is exact, must agree to 1e-4.  Only the schemes both runs have are
    compared: ``fresh`` may run fewer (``--schemes``) or more (schemes
    registered after ``stored`` was made, or left out of its run), per
    experiment; every other setting must be equal (``seed`` and the scheme
    lists aside).

    Parameters
    ----------
    stored, fresh
        Two :func:`run_all` outputs: the reference (e.g. :func:`load_results`)
        and the run to check.
    tolerance
        Entries that replace those of :data:`TOLERANCE`.

    Returns
    -------
    One line per difference, naming the experiment, the observation and the
    field (one line, ``"configs differ ..."``, when the settings differ); empty
    when the runs agree.
    """
    tol = dict(TOLERANCE, **(tolerance or {}))
    problems = []
    lists = ("schemes", "passkey_schemes", "recall_schemes")
    old_config, new_config = dict(stored["config"]), dict(fresh["config"])
    both = set()  # the schemes both runs have
    for key in lists[:2]:
        old_list = old_config.get(key) or old_config.get("schemes", ())  # None: as schemes
        new_list = new_config.get(key) or new_config.get("schemes", ())
        kept = [s for s in new_list if s in old_list]
        if not kept or kept != [s for s in old_list if s in new_list]:
            problems.append(f"configs differ ({key})")
            return problems
        both |= set(kept)
    for key in lists:
        old_config.pop(key, None), new_config.pop(key, None)
    old_config.pop("seed", None), new_config.pop("seed", None)
    if old_config != new_config:
        problems.append("configs differ")
        return problems

    # the schemes (and scalings, floor) stored for one experiment
    def stored_schemes(name: str) -> set[str]:
        return {r.get("scheme", "floor") for r in stored["results"].get(name, [])} | {"floor"}

    # a row of a scheme both runs have (or of no scheme)
    def common(row: Mapping[str, Any]) -> bool:
        return row.get("scheme", "floor").split(":")[0] in both | {"floor"}

    fresh_results = {
        name: [r for r in rows if r.get("scheme", "floor") in stored_schemes(name)]
        for name, rows in fresh["results"].items()
    }
    stored = dict(stored, results={
        n: [r for r in rows if common(r)] for n, rows in stored["results"].items()
    })  # fmt: skip
    old = _compared({n: stored["results"].get(n, []) for n in fresh_results})
    new = _compared(fresh_results)
    for stat in sorted(set(old) | set(new), key=repr):
        name, group, field = stat
        where = f"{name}[{', '.join(f'{k}={v}' for k, v in group)}].{field}"
        if stat not in old or stat not in new:
            problems.append(f"{where}: only in {'fresh' if stat in new else 'stored'}")
            continue
        a, b = old[stat], new[stat]
        ma, mb = math.fsum(a) / len(a), math.fsum(b) / len(b)
        if field == "floor":
            if abs(ma - mb) > 1e-4:
                problems.append(f"{where}: stored {ma:.4f} vs fresh {mb:.4f} (exact)")
            continue
        sd = _sd(a) if len(a) > 1 else _sd(b)
        margin = tol["accuracy"] if field == "accuracy" else tol["loss"]
        bound = tol["spread"] * sd * math.sqrt(1 / len(a) + 1 / len(b)) + margin
        if abs(ma - mb) > bound:
            problems.append(
                f"{where}: stored mean {ma:.4f} ({len(a)} seeds) vs fresh {mb:.4f} "
                f"({len(b)} seeds), allowed {bound:.4f}"
            )
    return problems


def _sd(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1))
