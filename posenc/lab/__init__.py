"""A length-extrapolation lab: train short, test long, every posenc scheme, on a CPU.

A tiny decoder-only transformer (:class:`TinyDecoder`) whose positional
scheme is any scheme of :mod:`posenc`, trained on synthetic data with a known
answer (:class:`CopyVocabSource`, whose per-token entropy is exact;
:class:`PasskeyTask`, retrieval from a chosen distance; :class:`RecallTask`,
multi-query associative recall, trained with every pair within the training length
``L`` and evaluated in distance bands that reach beyond it), and experiments that
each return a tidy table (:mod:`posenc.lab.experiments`; settings and trained models
in :mod:`posenc.lab.lab`, runs over seeds in :mod:`posenc.lab.run`).

Command line: ``python -m posenc.lab --help``.  Stored results, read with
:func:`load_results`: ``posenc/lab/results/{full,recall}.json`` (the discovery
set, seeds 0-4, which chose the chapter's claims), ``smoke.json`` (seeds 0-2 of
the ``smoke`` preset, every experiment at toy size, for the tests) and
``posenc/lab/results/{full,recall}-confirmation.json`` (seeds 5 and up, run
after the claims were frozen in :mod:`posenc.lab.propositions`), and
``posenc/lab/results/recall-warmup.json`` (an ablation: RoPE and xPos on seeds
5-10 with a longer warmup, paired with their confirmation models, which chose
the claims of the second freeze, :mod:`posenc.lab.warmup_propositions`) and
``posenc/lab/results/recall-warmup-confirmation.json`` (seeds 15-24, run after
it).  :data:`WITHDRAWN` names the stated claims that a confirmation set did not
replicate.  Flip-flop language modelling (:mod:`posenc.lab.flipflop`, presets
``fflm`` and ``fflm-length``) reproduces the PaTH paper's Table 1; its claims were
frozen in :mod:`posenc.lab.fflm_propositions` before any run of its seeds (35-44).

Importing this package needs only PyTorch; progress bars (``tqdm``) and
plots (``matplotlib``) are imported when used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .data import CopyVocabSource, PasskeyTask
from .experiments import DESCRIPTIONS, EXPERIMENTS, curse_batches, curse_summary
from .fflm import FFLM_TOKENS, FlipFlopTask, flip_flop, read_errors
from .gains import SESOI_ACCURACY, SESOI_LOSS, lead_effects, recall_gains, wilcoxon_exact
from .lab import FFLM_SCHEMES, PRESETS, ROPE_METHODS, Lab, LabConfig, rope_scaling_for
from .model import INJECTIONS, SCHEMES, TinyDecoder, check_scheme
from .patterns import LAYER_PATTERNS, LayerSpec, layer_pattern, pattern_from_layers
from .recall import learned_seeds
from .replication import DECLARED_SEEDS, WITHDRAWN, replication_tally
from .run import TOLERANCE, compare, format_seeds, merge, parse_seeds, run_all, summarize
from .stats import t_interval
from .sweeps import unseen_angle_pairs, yarn_split
from .tasks import LanguageTask, RecallTask, RetrievalTask
from .train import evaluate_accuracy, evaluate_loss, peak_memory_mb, seed_for, train
from .verdicts import PROPOSITIONS, check, failures, frozen_hash, propositions_for

__all__ = [
    "DECLARED_SEEDS",
    "DESCRIPTIONS",
    "EXPERIMENTS",
    "FFLM_SCHEMES",
    "FFLM_TOKENS",
    "INJECTIONS",
    "LAYER_PATTERNS",
    "PRESETS",
    "PROPOSITIONS",
    "RESULTS_DIR",
    "SPLITS",
    "ROPE_METHODS",
    "SESOI_ACCURACY",
    "SESOI_LOSS",
    "SCHEMES",
    "TOLERANCE",
    "WITHDRAWN",
    "CopyVocabSource",
    "FlipFlopTask",
    "Lab",
    "LabConfig",
    "LanguageTask",
    "LayerSpec",
    "PasskeyTask",
    "RecallTask",
    "RetrievalTask",
    "TinyDecoder",
    "check",
    "check_scheme",
    "compare",
    "curse_batches",
    "curse_summary",
    "evaluate_accuracy",
    "evaluate_loss",
    "failures",
    "flip_flop",
    "frozen_hash",
    "layer_pattern",
    "lead_effects",
    "learned_seeds",
    "load_results",
    "merge",
    "format_seeds",
    "parse_seeds",
    "pattern_from_layers",
    "peak_memory_mb",
    "propositions_for",
    "read_errors",
    "recall_gains",
    "replication_tally",
    "results_path",
    "rope_scaling_for",
    "run_all",
    "seed_for",
    "summarize",
    "t_interval",
    "train",
    "unseen_angle_pairs",
    "wilcoxon_exact",
    "yarn_split",
]

#: Where the stored results ship in the package: ``<preset>.json`` (the recall-warmup
#: ablation's seeds are 5-10) and, for the full, recall and recall-warmup presets,
#: ``<preset>-confirmation.json`` (:func:`results_path`).
RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: The two sets of seeds a preset's results come in: ``"discovery"`` (seeds 0-4, which
#: chose the chapter's claims; for recall-warmup the ablation's seeds 5-10, which chose
#: the second freeze's) and ``"confirmation"`` (seeds run after the claims were frozen:
#: 5-14 in :mod:`posenc.lab.propositions`, 15-24 in
#: :mod:`posenc.lab.warmup_propositions`).
SPLITS = ("discovery", "confirmation")


def results_path(
    preset: str = "full",
    directory: str | os.PathLike[str] | None = None,
    split: str = "discovery",
) -> Path:
    """The file of ``preset``'s results for ``split`` in ``directory``.

    Parameters
    ----------
    preset
        A name of :data:`PRESETS`.
    directory
        Where the results files are; default :data:`RESULTS_DIR`, the results
        shipped with the package.
    split
        One of :data:`SPLITS`.

    Returns
    -------
    ``directory / "<preset>.json"`` for the discovery set (seeds 0-4),
    ``directory / "<preset>-confirmation.json"`` for the confirmation set (seeds 5
    and up); the file need not exist.

    Examples
    --------
    >>> from posenc.lab import results_path
    >>> results_path("full", split="confirmation").name
    'full-confirmation.json'
    """
    from .._checks import check_choice

    check_choice("preset", preset, PRESETS)
    check_choice("split", split, SPLITS)
    name = f"{preset}.json" if split == "discovery" else f"{preset}-{split}.json"
    return (RESULTS_DIR if directory is None else Path(directory)) / name


def load_results(
    preset: str = "full",
    directory: str | os.PathLike[str] | None = None,
    split: str = "discovery",
) -> dict[str, Any]:
    """The stored output of ``run_all(PRESETS[preset], seeds=...)``, read from :func:`results_path`.

    Raises ``ValueError`` naming ``directory`` when it holds no results for
    ``preset``, and naming the file when it is not a complete results file
    (truncated, or not a run's output).

    Parameters
    ----------
    preset
        A name of :data:`PRESETS`.
    directory
        Where the results files are; default :data:`RESULTS_DIR`, the results
        shipped with the package.
    split
        ``"discovery"`` (seeds 0-4, which chose the chapter's claims) or
        ``"confirmation"`` (seeds 5 and up, run after the claims were frozen).

    Returns
    -------
    The JSON object :func:`run_all` returned: ``config`` (:meth:`LabConfig.to_dict`),
    ``seeds``, ``results`` (``{experiment: [row, ...]}``) and ``meta``.

    Examples
    --------
    >>> from posenc.lab import load_results
    >>> stored = load_results("smoke")
    >>> sorted(stored)
    ['config', 'meta', 'results', 'seeds']
    >>> stored["seeds"]
    [0, 1, 2]
    >>> load_results("full", split="confirmation")["seeds"]
    [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    """
    path = results_path(preset, directory, split)
    if not path.is_file():
        found = sorted(p.name for p in path.parent.glob("*.json")) if path.parent.is_dir() else []
        raise ValueError(
            f"directory must hold lab results ({path.name}, written by python -m posenc.lab); "
            f"{path.parent} has {', '.join(found) or 'none'}"
        )
    try:
        out = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{path} is not a complete lab results file (truncated or corrupted: {err})"
        ) from None
    if not isinstance(out, dict):
        kind = type(out).__name__
        raise ValueError(f"{path} must hold a JSON object (a run's output), got {kind}")
    return out
