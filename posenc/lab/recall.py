"""Multi-query associative recall: a task whose answer must be found by position.

The passkey task of :mod:`posenc.lab.data` hides a value that is unique by its
content, so attention can find it wherever it sits.  Here every answer must be
found by *position*: a sequence holds ``pairs`` key-value pairs ``k v`` among
filler tokens, then a query block that repeats every key, each followed by its
value, in a fresh order.  At a repeated key the model must name the token that
followed the same key earlier.  Keys and values are disjoint sets of
tokens, keys are distinct within a sequence and values are drawn independently,
so the content of the query says *which* earlier token to look for (its key)
but the answer is the token one position after it: a model needs the
relative offset between two tokens (an induction head; Olsson et al., 2022).
This is the multi-query associative recall (MQAR) of Arora et al. (2023),
with the pairs spread among fillers.  The fillers are drawn from the value
tokens, so no content marks a value as an answer: a model that only knows
which tokens are in view guesses at about chance.

Token ids: keys ``0 .. keys-1``, values (and fillers) ``keys .. keys+values-1``;
:attr:`RecallTask.vocab` is their count.

Samplers, all fresh draws from a :class:`torch.Generator`:

* :meth:`RecallTask.batch` (training and the in-view score, any length): the
  pairs anywhere before the query block; every query round is scored.
* :meth:`RecallTask.band_batch`: every scored query's key lies a chosen number
  of tokens before that query (a distance *band*); the distance of every
  answer is returned and stored.
* :meth:`RecallTask.needle_batch`: one scored pair (the needle) at a chosen
  depth of the context, the other pairs at random; only the needle's answer
  is scored.

The experiments score the argmax over the value tokens at every scored query:
chance is ``1 / values``.  ``recall()`` scores each model in view (each
query round apart) and by band at every context, and the same model with its
attention limited to its last ``L`` keys (the *window-of-L control*: recall
of a key more than ``L`` back beyond what that control reaches needs the
model's own reach); :func:`recall_curve` gives the in-view accuracy probed
during training (steps to the learning criterion); :func:`needle_grid` the
needle's accuracy by depth and context.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any, TypeAlias

import torch

from .lab import ROPE_METHODS, Lab, Row, rope_scaling_for
from .model import TinyDecoder
from .scoring import recall_accuracy, recall_hits, round_accuracies, rounded
from .tasks import RecallTask
from .train import seed_for

__all__ = [
    "DESCRIPTIONS", "EXPERIMENTS", "RecallTask", "bands", "criterion_step", "learned_seeds",
    "learned_threshold", "needle_grid", "recall", "recall_accuracy", "recall_answers",
    "recall_curve", "recall_hits", "recall_lead", "round_accuracies",
]  # fmt: skip

# (lo, hi, inputs, targets, weights, distances) of one band at one context
_BandInputs: TypeAlias = tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
# (inputs, targets, weights) of a scored batch
_Batch3: TypeAlias = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _schemes(lab: Lab) -> tuple[str, ...]:
    return lab.config.recall_schemes or lab.config.schemes


def bands(train_len: int, factor: int, block: int) -> list[tuple[str, int, int]]:
    """``[(label, lo, hi), ...]``: the distance bands scored at context ``factor * L``:
    ``< L`` (1 to ``L - 1``), then ``L-2L``, ``2L-4L``, ... (``c L`` to ``2 c L - 1``), each
    while its ``lo`` fits before the first query of an input of ``factor * L`` tokens
    (``lo <= factor L - block``).  Distances past the input are cut by the sampler."""
    L = train_len
    out = [("<L", 1, L - 1)]
    c = 1
    while c * L <= factor * L - block:
        out.append((f"{'' if c == 1 else c}L-{2 * c}L", c * L, 2 * c * L - 1))
        c *= 2
    return out


def _band_inputs(lab: Lab) -> dict[tuple[int, str], _BandInputs]:
    """``{(factor, label): (lo, hi, inputs, targets, weights, distances)}``: the band inputs
    of one seed, shared by every model (fixed by the seed, the factor and the band)."""
    c = lab.config
    L, task = c.train_len, lab.recall
    count = math.ceil(c.recall_band_answers / task.pairs)
    out: dict[tuple[int, str], _BandInputs] = {}
    for f in c.recall_factors:
        for label, lo, hi in bands(L, f, task.block):
            g = torch.Generator().manual_seed(seed_for(c.seed, "recall-band", f, lo))
            out[f, label] = (lo, hi, *task.band_batch(count, f * L, lo, hi, g))
    return out


def recall(lab: Lab) -> list[Row]:
    """Every recall model scored in view and by distance band, with the window-of-L control.

    In view (``factor = 0``): ``recall_sequences`` ordinary inputs of ``L``;
    ``accuracy`` over every query round, ``accuracy_round1`` and
    ``accuracy_round2`` apart (the first round's answers lie before the query
    block, the second's also a few tokens back inside it), ``learned``
    (``accuracy`` above :func:`learned_threshold`) and ``criterion_step``
    (:func:`criterion_step`, ``None`` when never reached).

    By band (``factor = c``): for each context ``c L`` and each band of
    :func:`bands`, ``recall_band_answers`` answers whose key lies that far
    before its query (:meth:`RecallTask.band_batch`, the same inputs for every
    model), scored with full attention (``attention = "full"``) and with
    attention limited to the last ``L`` keys (``"window"``).  Fields:
    ``band``, ``lo``, ``hi``, ``answers``, ``correct``, ``accuracy``,
    ``chance`` and ``hits`` (one character per answer, ``"1"`` if right, in the
    order of :func:`recall_answers`' ``distances``).  RoPE is also scored with
    each scaling at factor ``c`` (rows ``rope:<method>``, ``c > 1``).

    With ``recall_control_schemes``, each such scheme's trained window-of-``L``
    control (``Lab.model("recall", scheme, window=L)``) is scored on the same band
    inputs (``attention = "trained-window"``; for ``rope:<method>`` with the same
    scaling), and its in-view accuracy is the in-view row's ``control_accuracy``.
    """
    c = lab.config
    L, task = c.train_len, lab.recall
    g = torch.Generator().manual_seed(seed_for(c.seed, "recall-eval"))
    near = task.batch(c.recall_sequences, L, g)
    inputs = _band_inputs(lab)
    chance = rounded(1 / task.values)
    threshold = learned_threshold(task)
    rows: list[Row] = []

    def by_band(
        name: str, model: TinyDecoder, factors: Collection[int], control: TinyDecoder | None
    ) -> None:
        masked = copy.deepcopy(model)
        masked.window = L
        scorers = [("full", model), ("window", masked)]
        if control is not None:
            scorers.append(("trained-window", control))
        for (f, label), (lo, hi, x, y, w, _) in inputs.items():
            if f not in factors or (model.max_len is not None and f * L > model.max_len):
                continue
            for attention, scored in scorers:
                hits = recall_hits(scored, task, x, y, w)
                rows.append(
                    {"scheme": name, "factor": f, "length": f * L, "band": label, "lo": lo,
                     "hi": hi, "attention": attention, "answers": len(hits),
                     "correct": int(hits.sum()), "accuracy": rounded(hits.double().mean()),
                     "chance": chance, "hits": "".join("1" if h else "0" for h in hits.tolist())}
                )  # fmt: skip

    for scheme in _schemes(lab):
        model, _ = lab.model("recall", scheme)
        control = None
        if scheme in c.recall_control_schemes:
            control, _ = lab.model("recall", scheme, window=L)
        view = round_accuracies(model, task, *near)
        step = criterion_step(lab.probes[("recall", scheme, "input")], threshold)
        extra = {}
        if control is not None:
            extra["control_accuracy"] = round_accuracies(control, task, *near)["accuracy"]
        rows.append(
            {"scheme": scheme, "factor": 0, "length": L, **view,
             "answers": int((near[2] > 0).sum()), "chance": chance,
             "learned": 1.0 if view["accuracy"] > threshold else 0.0,
             "criterion_step": None if step is None else float(step), **extra}
        )  # fmt: skip
        by_band(scheme, model, c.recall_factors, control)
        if scheme == "rope":
            for method, f, scaled in _rope_scalings(lab, model):
                control_scaled = None
                if control is not None:
                    control_scaled = _scaled(lab, control, method, f)
                by_band(f"rope:{method}", scaled, (f,), control_scaled)
    return rows


def _scaled(lab: Lab, model: TinyDecoder, method: str, factor: int) -> TinyDecoder:
    """A copy of ``model`` with RoPE scaled by ``method`` for contexts of ``factor L``."""
    scaled = copy.deepcopy(model)
    scaled.set_rope_scaling(rope_scaling_for(method, factor, lab.config.train_len))
    return scaled.to(lab.device)


def _rope_scalings(lab: Lab, model: TinyDecoder) -> Iterator[tuple[str, int, TinyDecoder]]:
    """``(method, factor, scaled copy of model)`` for each scaling of ``ROPE_METHODS``
    (after ``"none"``) at each recall context beyond ``L``: the RoPE rows of ``recall()``
    and of the needle grid."""
    for method in ROPE_METHODS[1:]:
        for f in lab.config.recall_factors:
            if f > 1:
                yield method, f, _scaled(lab, model, method, f)


def recall_lead(lab: Lab) -> list[Row]:
    """The far bands scored at two places in the input: where ``recall()`` puts them, and
    ``recall_lead * L`` tokens later.

    At the largest context ``c L`` of ``recall_factors``, every band beyond ``L``
    places its keys in the first part of the input (the ``4L-8L`` band at ``8L``
    in its first half), so distance and position from the start go together.
    Here the same band inputs are scored as they are (``lead = 0``) and with
    ``recall_lead * L`` filler tokens before them (:meth:`RecallTask.lead`): every
    query keeps its key at the same distance, the same answers are scored in the
    same order, and only the positions move.  Fields as ``recall()``'s band rows,
    and ``lead`` (fillers before the inputs, in tokens); ``length`` counts them.
    With ``recall_lead = 0`` there are no rows.  A model with an input table too
    short for the moved inputs is left out.
    """
    c = lab.config
    if c.recall_lead == 0:
        return []
    L, task = c.train_len, lab.recall
    factor = max(c.recall_factors)
    lead = c.recall_lead * L
    chance = rounded(1 / task.values)
    moved: dict[str, tuple[int, int, list[_Batch3]]] = {}
    for (f, label), (lo, hi, x, y, w, _) in _band_inputs(lab).items():
        if f == factor and label != "<L":
            g = torch.Generator().manual_seed(seed_for(c.seed, "recall-lead", f, lo))
            moved[label] = (lo, hi, [(x, y, w), task.lead(x, y, w, lead, g)])
    rows: list[Row] = []
    for scheme in _schemes(lab):
        model, _ = lab.model("recall", scheme)
        if model.max_len is not None and factor * L + lead > model.max_len:
            continue
        window = copy.deepcopy(model)
        window.window = L
        for label, (lo, hi, batches) in moved.items():
            for n, (x, y, w) in zip((0, lead), batches, strict=True):
                for attention, scored in (("full", model), ("window", window)):
                    hits = recall_hits(scored, task, x, y, w)
                    rows.append(
                        {"scheme": scheme, "factor": factor, "lead": n, "length": x.shape[1],
                         "band": label, "lo": lo, "hi": hi, "attention": attention,
                         "answers": len(hits), "correct": int(hits.sum()),
                         "accuracy": rounded(hits.double().mean()), "chance": chance,
                         "hits": "".join("1" if h else "0" for h in hits.tolist())}
                    )  # fmt: skip
    return rows


def recall_answers(lab: Lab) -> list[Row]:
    """The distance of every answer ``recall()`` scores by band: one row per context and
    band, ``distances`` (query position minus key position, in the order of the ``hits``
    of the rows of ``recall()``).  Needs no model."""
    return [
        {"factor": f, "band": label, "lo": lo, "hi": hi, "distances": d.flatten().tolist()}
        for (f, label), (lo, hi, *_, d) in _band_inputs(lab).items()
    ]


def criterion_step(probes: Iterable[Mapping[str, float]], threshold: float) -> float | None:
    """The first probed step whose in-view accuracy exceeds ``threshold`` (``None``: never).

    ``probes``: :attr:`Lab.probes` entries, whose ``step`` is an int (returned as stored).
    """
    return next((p["step"] for p in probes if p["accuracy"] > threshold), None)


def recall_curve(lab: Lab) -> list[Row]:
    """The in-view accuracy of every recall model, probed during training every
    ``recall_probe_every`` steps on ``recall_probe_sequences`` fixed inputs: rows
    ``scheme``, ``step``, ``accuracy``, ``accuracy_round1``, ``accuracy_round2``."""
    rows: list[Row] = []
    for scheme in _schemes(lab):
        lab.model("recall", scheme)
        rows += [{"scheme": scheme, **p} for p in lab.probes[("recall", scheme, "input")]]
    return rows


def needle_grid(lab: Lab) -> list[Row]:
    """Accuracy of the needle's answer at each depth (``needle_depths``) and context
    ``c L`` (``c`` in ``recall_factors``): one grid per scheme, the recall models.

    With ``needle_scalings``, RoPE is also scored with each scaling at every ``c > 1``
    (rows ``rope:<method>``, on the same inputs as the plain model's)."""
    c = lab.config
    L, task = c.train_len, lab.recall
    rows: list[Row] = []
    sequences = max(32, c.recall_sequences // 2)

    def grid(name: str, model: TinyDecoder, factors: Iterable[int]) -> None:
        for f in factors:
            if model.max_len is not None and f * L > model.max_len:
                continue
            for depth in c.needle_depths:
                g = torch.Generator().manual_seed(seed_for(c.seed, "needle", f, depth))
                acc, loss = recall_accuracy(
                    model, task, *task.needle_batch(sequences, f * L, depth, g)
                )
                rows.append(
                    {"scheme": name, "factor": f, "length": f * L, "depth": float(depth),
                     "accuracy": rounded(acc), "loss": rounded(loss)}
                )  # fmt: skip

    for scheme in _schemes(lab):
        model, _ = lab.model("recall", scheme)
        grid(scheme, model, c.recall_factors)
        if scheme == "rope" and c.needle_scalings:
            for method, f, scaled in _rope_scalings(lab, model):
                grid(f"rope:{method}", scaled, (f,))
    return rows


def learned_threshold(task: RecallTask) -> float:
    """In-view accuracy above which a model counts as having learned the task.

    The in-view inputs score every query round.  From the second round on, the
    answer also sits a few tokens back in the query block, so a model that
    solves only that short-range lookup and guesses the first round scores
    ``ceiling = 1 - (1 - chance) / rounds`` (0.53 for two rounds and 16
    values): the plateau's top.  The threshold lies halfway between that and
    1 (0.77), so a model must answer most first-round queries, whose pairs lie
    before the block.
    """
    chance = 1 / task.values
    ceiling = 1 - (1 - chance) / task.rounds
    return (1 + ceiling) / 2


def learned_seeds(rows: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """How many seeds of each scheme learned the recall task, from ``recall()`` rows.

    Parameters
    ----------
    rows
        Rows of the ``recall`` experiment (its in-view rows, ``factor == 0``, are
        read; the others are skipped).

    Returns
    -------
    ``{scheme: (seeds that learned the task, seeds)}``, schemes in order of
    first appearance.
    """
    out: dict[str, tuple[int, int]] = {}
    for r in rows:
        if r.get("factor") == 0:
            got, total = out.get(r["scheme"], (0, 0))
            out[r["scheme"]] = (got + int(r["learned"]), total + 1)
    return out


EXPERIMENTS = {
    "recall": recall,
    "recall_answers": recall_answers,
    "recall_curve": recall_curve,
    "needle_grid": needle_grid,
    "recall_lead": recall_lead,
}

DESCRIPTIONS = {
    "recall": "multi-query associative recall: in-view accuracy by query round, and accuracy "
    "by distance band (<L, L-2L, 2L-4L, 4L-8L) at contexts L..8L, with attention limited "
    "to the last L keys as the control (RoPE also with its scalings)",
    "recall_answers": "the distance from every query recall scores by band to its key",
    "recall_curve": "in-view recall accuracy probed during training (steps to the criterion)",
    "needle_grid": "recall of one pair placed at depth 0-100% of contexts L..8L, every scheme",
    "recall_lead": "the far bands at the largest context again with recall_lead x L fillers "
    "before the same inputs: distance kept, position from the start moved (recall_lead > 0)",
}
