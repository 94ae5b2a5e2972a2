"""A length-extrapolation lab: train short, test long, every posenc scheme, on a CPU.

A tiny decoder-only transformer (:class:`TinyDecoder`) whose positional
scheme is any scheme of :mod:`posenc`, trained on synthetic data with a known
answer (:class:`CopyVocabSource`, whose per-token entropy is exact;
:class:`PasskeyTask`, retrieval from a chosen distance; :class:`RecallTask`,
multi-query associative recall with the answer more than ``L`` back), and experiments that
each return a tidy table (:mod:`posenc.lab.experiments`; settings and trained models
in :mod:`posenc.lab.lab`, runs over seeds in :mod:`posenc.lab.run`).

Command line: ``python -m posenc.lab --help``.  Stored results:
``posenc/lab/results/{full,recall,smoke}.json``, read with :func:`load_results`.

Importing this package needs only PyTorch; progress bars (``tqdm``) and
plots (``matplotlib``) are imported when used.
"""

from __future__ import annotations

import json
from pathlib import Path

from .data import CopyVocabSource, PasskeyTask
from .experiments import DESCRIPTIONS, EXPERIMENTS, curse_batches, curse_summary
from .lab import PRESETS, ROPE_METHODS, Lab, LabConfig, rope_scaling_for
from .model import INJECTIONS, SCHEMES, TinyDecoder, check_scheme
from .propositions import PROPOSITIONS, RECALL_PROPOSITIONS, check, failures, t_interval
from .recall import learned_seeds
from .run import TOLERANCE, compare, parse_seeds, run_all, summarize
from .sweeps import unseen_angle_pairs, yarn_split
from .tasks import LanguageTask, RecallTask, RetrievalTask
from .train import evaluate_accuracy, evaluate_loss, peak_memory_mb, seed_for, train

__all__ = [
    "DESCRIPTIONS",
    "EXPERIMENTS",
    "INJECTIONS",
    "PRESETS",
    "PROPOSITIONS",
    "RECALL_PROPOSITIONS",
    "RESULTS_DIR",
    "ROPE_METHODS",
    "SCHEMES",
    "TOLERANCE",
    "CopyVocabSource",
    "Lab",
    "LabConfig",
    "LanguageTask",
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
    "learned_seeds",
    "load_results",
    "parse_seeds",
    "peak_memory_mb",
    "rope_scaling_for",
    "run_all",
    "seed_for",
    "summarize",
    "t_interval",
    "train",
    "unseen_angle_pairs",
    "yarn_split",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def load_results(preset: str = "full", directory=None) -> dict:
    """The stored output of ``run_all(PRESETS[preset], seeds=...)``: ``<directory>/<preset>.json``.

    ``directory`` defaults to the results shipped with the package
    (:data:`RESULTS_DIR`).  Raises ``ValueError`` naming ``directory`` when it
    holds no results for ``preset``.
    """
    from .._checks import check_choice

    check_choice("preset", preset, PRESETS)
    path = (RESULTS_DIR if directory is None else Path(directory)) / f"{preset}.json"
    if not path.is_file():
        found = sorted(p.stem for p in path.parent.glob("*.json")) if path.parent.is_dir() else []
        raise ValueError(
            f"directory must hold lab results ({preset}.json, written by python -m posenc.lab); "
            f"{path.parent} has {', '.join(found) or 'none'}"
        )
    return json.loads(path.read_text())
