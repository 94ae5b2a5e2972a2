"""A length-extrapolation lab: train short, test long, every posenc scheme, on a CPU.

A tiny decoder-only transformer (:class:`TinyDecoder`) whose positional
scheme is any scheme of :mod:`posenc`, trained on synthetic data with a known
answer (:class:`CopyVocabSource`, whose per-token entropy is exact;
:class:`PasskeyTask`, retrieval from a chosen distance), and experiments that
each return a tidy table (:mod:`posenc.lab.experiments`).

Command line: ``python -m posenc.lab --help``.  Stored results:
``posenc/lab/results/{full,smoke}.json``, read with :func:`load_results`.

Importing this package needs only PyTorch; progress bars (``tqdm``) and
plots (``matplotlib``) are imported when used.
"""

from __future__ import annotations

import json
from pathlib import Path

from .data import CopyVocabSource, PasskeyTask
from .experiments import (
    EXPERIMENTS,
    PRESETS,
    ROPE_METHODS,
    TOLERANCE,
    Lab,
    LabConfig,
    compare,
    curse_summary,
    rope_scaling_for,
    run_all,
)
from .model import INJECTIONS, SCHEMES, TinyDecoder, check_scheme
from .tasks import LanguageTask, RetrievalTask
from .train import evaluate_accuracy, evaluate_loss, peak_memory_mb, seed_for, train

__all__ = [
    "EXPERIMENTS",
    "INJECTIONS",
    "PRESETS",
    "RESULTS_DIR",
    "ROPE_METHODS",
    "SCHEMES",
    "TOLERANCE",
    "CopyVocabSource",
    "Lab",
    "LabConfig",
    "LanguageTask",
    "PasskeyTask",
    "RetrievalTask",
    "TinyDecoder",
    "check_scheme",
    "compare",
    "curse_summary",
    "evaluate_accuracy",
    "evaluate_loss",
    "load_results",
    "peak_memory_mb",
    "rope_scaling_for",
    "run_all",
    "seed_for",
    "train",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def load_results(preset: str = "full") -> dict:
    """The stored output of ``run_all(PRESETS[preset])`` (``posenc/lab/results/<preset>.json``)."""
    from .._checks import check_choice

    check_choice("preset", preset, PRESETS)
    return json.loads((RESULTS_DIR / f"{preset}.json").read_text())
