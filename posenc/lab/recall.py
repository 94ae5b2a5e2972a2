"""Multi-query associative recall: a task whose answer lies more than ``L`` back.

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

Three samplers, all fresh draws from a :class:`torch.Generator`:

* :meth:`RecallTask.batch` (training, any length): the pairs anywhere before
  the query block; every query's answer is scored.
* :meth:`RecallTask.far_batch`: an input of ``length`` tokens whose pairs all
  lie in ``[length - 2 span, length - span)``, so that the last ``span``
  tokens (the context a model trained at ``L = span`` sees) hold the query
  block and fillers only.  Cutting the same input to its last ``c`` tokens
  gives the *same scored answers* at every context ``c``: below ``2 span`` the
  pairs are out of view and only a guess is possible.
* :meth:`RecallTask.needle_batch`: one scored pair (the needle) at a chosen
  depth of the context, the other pairs at random; only the needle's answer
  is scored.

The experiments (:func:`recall`, :func:`needle_grid`) score the argmax over
the value tokens at every scored query: chance is ``1 / values``.
"""

from __future__ import annotations

import copy

import torch

from .lab import ROPE_METHODS, Lab, rope_scaling_for, rounded
from .tasks import RecallTask
from .train import seed_for

__all__ = [
    "DESCRIPTIONS", "EXPERIMENTS", "RecallTask", "learned_seeds", "learned_threshold",
    "needle_grid", "recall", "recall_budget",
    "recall_accuracy",
]  # fmt: skip


# ------------------------------------------------------------------ scoring


@torch.no_grad()
def recall_accuracy(model, task: RecallTask, inputs, targets, weights, max_batch: int = 16):
    """``(accuracy, loss)`` over the scored answers: argmax over the value tokens, and
    the cross-entropy over the whole vocabulary (nats), both means over scored answers."""
    model.eval()
    device = next(model.parameters()).device
    lo, hi = task.keys, task.keys + task.values
    correct, loss, count = 0, 0.0, 0
    for start in range(0, len(inputs), max_batch):
        x = inputs[start : start + max_batch].to(device)
        y = targets[start : start + max_batch].to(device)
        w = weights[start : start + max_batch].to(device) > 0
        logits = model(x)[w].float()
        correct += int((logits[:, lo:hi].argmax(-1) + lo == y[w]).sum())
        loss += torch.nn.functional.cross_entropy(logits, y[w], reduction="sum").item()
        count += int(w.sum())
    return correct / count, loss / count


def _schemes(lab: Lab) -> tuple[str, ...]:
    return lab.config.recall_schemes or lab.config.schemes


def recall(lab: Lab) -> list[dict]:
    """Accuracy (and loss) on the same scored answers at contexts ``c L``, ``c`` in
    ``recall_factors``, with every pair between ``L`` and ``2L`` tokens before the
    end (:meth:`RecallTask.far_batch` with ``span = L``).

    Also the accuracy at ``L`` on ordinary inputs (``factor = 0``: pairs
    within view, as in training), which tells whether the model learned the
    task at all (``learned``, see :func:`learned_threshold`).  At context
    ``L`` the answers are out of view; accuracy above chance beyond ``L``
    needs a model that reaches and locates a token more than ``L`` back.
    RoPE is also scored with each scaling at factor ``c`` (rows ``rope:<method>``).
    """
    return _recall_rows(lab, _schemes(lab))


def recall_budget(lab: Lab) -> list[dict]:
    """:func:`recall` for ``recall_long_schemes`` trained ``recall_long_steps`` steps.

    Whether a model leaves the guessing plateau depends on the training
    budget: the cosine schedule of a longer run keeps a high learning rate for
    longer.  Same evaluation data as :func:`recall`; every row adds ``steps``.
    """
    c = lab.config
    return _recall_rows(lab, c.recall_long_schemes, steps=c.recall_long_steps)


def _recall_rows(lab: Lab, schemes, steps=None) -> list[dict]:
    c = lab.config
    L, task = c.train_len, lab.recall
    longest = L * max(max(c.recall_factors), 2)
    g = torch.Generator().manual_seed(seed_for(c.seed, "recall-eval"))
    far = task.far_batch(c.recall_sequences, longest, L, g)
    near = task.batch(c.recall_sequences, L, g)
    chance = 1 / task.values
    extra = {} if steps is None else {"steps": steps}
    rows = []

    def score(name, model, factor, inputs, targets, weights):
        acc, loss = recall_accuracy(model, task, inputs, targets, weights)
        rows.append(
            {"scheme": name, **extra, "factor": factor, "length": inputs.shape[1],
             "accuracy": rounded(acc), "loss": rounded(loss), "chance": rounded(chance)}
        )  # fmt: skip
        return acc

    for scheme in schemes:
        model, _ = lab.model("recall", scheme, **extra)
        acc = score(scheme, model, 0, *near)
        learned = acc > learned_threshold(task)
        rows[-1]["learned"] = 1.0 if learned else 0.0  # a float: averaged over seeds
        for f in c.recall_factors:
            if model.max_len is None or f * L <= model.max_len:
                score(scheme, model, f, *(t[:, -f * L :] for t in far))
        if scheme == "rope":
            for method in ROPE_METHODS[1:]:
                for f in c.recall_factors:
                    if f == 1:
                        continue
                    scaled = copy.deepcopy(model)
                    scaled.set_rope_scaling(rope_scaling_for(method, f, L))
                    scaled.to(lab.device)
                    score(f"rope:{method}", scaled, f, *(t[:, -f * L :] for t in far))
    return rows


def needle_grid(lab: Lab) -> list[dict]:
    """Accuracy of the needle's answer at each depth (``needle_depths``) and context
    ``c L`` (``c`` in ``recall_factors``): one grid per scheme, the recall models."""
    c = lab.config
    L, task = c.train_len, lab.recall
    rows = []
    sequences = max(32, c.recall_sequences // 2)
    for scheme in _schemes(lab):
        model, _ = lab.model("recall", scheme)
        for f in c.recall_factors:
            if model.max_len is not None and f * L > model.max_len:
                continue
            for depth in c.needle_depths:
                g = torch.Generator().manual_seed(seed_for(c.seed, "needle", f, depth))
                acc, loss = recall_accuracy(
                    model, task, *task.needle_batch(sequences, f * L, depth, g)
                )
                rows.append(
                    {"scheme": scheme, "factor": f, "length": f * L, "depth": float(depth),
                     "accuracy": rounded(acc), "loss": rounded(loss)}
                )  # fmt: skip
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


def learned_seeds(rows: list[dict]) -> dict:
    """``{scheme: (seeds that learned the task, seeds)}`` from :func:`recall` rows."""
    out: dict = {}
    for r in rows:
        if r.get("factor") == 0:
            got, total = out.get(r["scheme"], (0, 0))
            out[r["scheme"]] = (got + int(r["learned"]), total + 1)
    return out


EXPERIMENTS = {"recall": recall, "needle_grid": needle_grid, "recall_budget": recall_budget}

DESCRIPTIONS = {
    "recall": "multi-query associative recall: accuracy on the same answers at contexts "
    "L..8L with every pair more than L back (RoPE also with its scalings)",
    "needle_grid": "recall of one pair placed at depth 0-100% of contexts L..8L, every scheme",
    "recall_budget": "recall again for recall_long_schemes (RoPE, xPos, Kerple) trained "
    "recall_long_steps (9000)",
}
