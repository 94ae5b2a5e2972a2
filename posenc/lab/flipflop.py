"""Flip-flop language modelling (FFLM) as a lab experiment: read errors by scheme.

The task of Liu et al. (NeurIPS 2023, arXiv 2306.00946; :mod:`posenc.lab.fflm`) and
the table the PaTH paper reports on it (Yang et al., NeurIPS 2025, arXiv 2505.16381,
§4.1, Table 1): a one-layer, two-head transformer of width 64 is trained on FFL(0.8)
at 512 tokens and scored on FFL(0.8) (in distribution), FFL(0.98) (sparse: long gaps
between a write and its read) and FFL(0.1) (dense).  Only the bit after each read is
determined by what came before, so only those bits are scored, and the training
loss counts them alone (:class:`~posenc.lab.FlipFlopTask`'s weights).

**What counts as an error.**  At the position of every read, the model's
prediction is the argmax of its logits over the *whole* vocabulary (the five tokens
``w r i 0 1``), and it errs when that is not the bit the read must return: a model
that predicts an instruction there errs.  This is the model's greedy prediction, which
FFLM's paper scores; the public reimplementations consulted (which train on the
authors' released FFLM data) do the same, the argmax over every token at the read
positions counted against the number of reads.  The authors' own evaluation code was
not found.  Ties go to the first maximal token, as ``torch.argmax`` breaks them.

**The experiments** (each a tidy table, one row per seed and observation; counts
are ints, so a Clopper-Pearson interval over all scored reads can be computed from
the rows):

* :func:`fflm`: every scheme of ``config.schemes`` trained on FFL(``fflm_p_ignore``)
  at ``fflm_train_len`` tokens, scored on FFL(``p``) for each ``p`` of
  ``fflm_eval_p`` at each length of ``fflm_eval_lengths``;
* :func:`fflm_curve`: the same models' in-distribution read errors and read loss,
  probed during training, beside the training loss over the same steps.

Settings: the ``fflm_*`` fields of :class:`~posenc.lab.LabConfig`; model width,
depth and heads are the configuration's own (the ``fflm`` presets set one layer, two
heads, width 64).  The presets ``fflm`` and ``fflm-length`` run them, and
:mod:`posenc.lab.fflm_propositions` froze what their rows must show.
"""

from __future__ import annotations

import math

import torch

from .fflm import FlipFlopTask, read_errors
from .lab import Lab, Row, rounded
from .train import seed_for

__all__ = [
    "DESCRIPTIONS", "EXPERIMENTS", "eval_label", "eval_sequences", "expected_reads", "fflm",
    "fflm_curve", "read_errors",
]  # fmt: skip

# tokens (batch, length) -> logits (batch, length, vocab): a TinyDecoder or any function


@torch.no_grad()
def expected_reads(p_ignore: float, length: int) -> float:
    """The expected number of reads in a flip-flop sequence of ``length`` tokens.

    The first of the ``length / 2`` instructions is a write, the last a read, and
    each of the ``length / 2 - 2`` between is a read with probability
    ``(1 - p_ignore) / 2`` (:func:`~posenc.lab.flip_flop`).

    Examples
    --------
    >>> from posenc.lab.flipflop import expected_reads
    >>> expected_reads(0.8, 512), expected_reads(0.98, 512), expected_reads(0.1, 512)
    (26.4, 3.54, 115.3)
    """
    return round(1 + (length // 2 - 2) * (1 - p_ignore) / 2, 10)


def eval_sequences(reads: int, p_ignore: float, length: int) -> int:
    """Sequences of ``length`` tokens that hold about ``reads`` reads of FFL(``p_ignore``):
    ``ceil(reads / expected_reads(p_ignore, length))``.

    Examples
    --------
    >>> from posenc.lab.flipflop import eval_sequences
    >>> [eval_sequences(8192, p, 512) for p in (0.8, 0.98, 0.1)]
    [311, 2315, 72]
    """
    return math.ceil(reads / expected_reads(p_ignore, length))


def eval_label(p_ignore: float, train_p_ignore: float) -> str:
    """``"id"`` (in distribution) when ``p_ignore`` is the training one, ``"sparse"`` when
    larger (longer gaps between a write and its read), ``"dense"`` when smaller."""
    if p_ignore == train_p_ignore:
        return "id"
    return "sparse" if p_ignore > train_p_ignore else "dense"


def fflm(lab: Lab) -> list[Row]:
    """Read errors of every scheme's flip-flop model, per evaluation and length.

    Each scheme of ``config.schemes`` is trained on FFL(``fflm_p_ignore``) at
    ``fflm_train_len`` tokens (:meth:`Lab.model` with task ``"fflm"``), then scored
    on FFL(``p``) for each ``p`` of ``fflm_eval_p`` at each length ``n`` of
    ``fflm_eval_lengths``: :func:`eval_sequences` fresh sequences, about
    ``fflm_eval_reads`` reads, drawn from a generator seeded with
    ``seed_for(seed, "fflm-eval", p, n)`` (the same for every scheme).

    Rows: ``scheme``, ``eval`` (:func:`eval_label`), ``p_ignore``, ``length``
    (tokens per sequence), ``train_len``, ``sequences``, ``reads``, ``errors`` (ints:
    the argmax over the whole vocabulary is not the read's bit; see
    :func:`read_errors`), ``error_rate`` (``errors / reads``, rounded) and ``loss``
    (nats per read).
    """
    c = lab.config
    rows: list[Row] = []
    data = {
        (p, n): FlipFlopTask(p).batch(
            eval_sequences(c.fflm_eval_reads, p, n),
            n - 1,
            torch.Generator().manual_seed(seed_for(c.seed, "fflm-eval", p, n)),
        )
        for n in c.fflm_eval_lengths
        for p in c.fflm_eval_p
    }
    for scheme in c.schemes:
        model, _ = lab.model("fflm", scheme)
        for (p, n), (x, y, w) in data.items():
            reads, errors, loss = read_errors(model, x, y, w, max_batch=max(1, 8192 // n))
            rows.append(
                {"scheme": scheme, "eval": eval_label(p, c.fflm_p_ignore), "p_ignore": p,
                 "length": n, "train_len": c.fflm_train_len, "sequences": len(x),
                 "reads": reads, "errors": errors, "error_rate": rounded(errors / reads),
                 "loss": rounded(loss)}
            )  # fmt: skip
    return rows


def fflm_curve(lab: Lab) -> list[Row]:
    """The flip-flop models' training curves, at every probe.

    Every ``fflm_probe_every`` steps the model is scored on ``fflm_probe_sequences``
    fixed FFL(``fflm_p_ignore``) sequences of the training length (seeded with
    ``seed_for(seed, "fflm-probe")``, the same for every scheme).  Rows: ``scheme``,
    ``step``, ``reads``, ``errors`` (ints, as in :func:`fflm`), ``error_rate``,
    ``loss`` (nats per read on the probe sequences) and ``train_loss`` (the mean
    training loss, nats per read, over the ``fflm_probe_every`` steps up to the probe:
    the flip-flop models log their training curve once per probe interval).
    """
    c = lab.config
    rows: list[Row] = []
    for scheme in c.schemes:
        _, curve = lab.model("fflm", scheme)
        for probe, train_loss in zip(lab.probes[("fflm", scheme, "input")], curve, strict=False):
            reads, errors = int(probe["reads"]), int(probe["errors"])
            rows.append(
                {"scheme": scheme, "step": int(probe["step"]), "reads": reads, "errors": errors,
                 "error_rate": rounded(errors / reads), "loss": rounded(probe["loss"]),
                 "train_loss": rounded(train_loss)}
            )  # fmt: skip
    return rows


EXPERIMENTS = {"fflm": fflm, "fflm_curve": fflm_curve}

DESCRIPTIONS = {
    "fflm": "flip-flop language modelling (the PaTH paper's Table 1): read errors of every "
    "scheme trained on FFL(0.8), scored in distribution, sparse FFL(0.98) and dense FFL(0.1)",
    "fflm_curve": "the flip-flop models' read errors and loss probed during training",
}
