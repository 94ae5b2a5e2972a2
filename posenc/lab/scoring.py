"""Scoring a model on the recall task's inputs (:class:`~posenc.lab.tasks.RecallTask`).

Kept apart from :mod:`posenc.lab.recall` (the experiments) because training in
:class:`~posenc.lab.lab.Lab` probes the in-view accuracy with these functions, and
the experiments build on the lab.  Every stored float is :func:`rounded`.
"""

from __future__ import annotations

from typing import SupportsFloat

import torch

from .tasks import RecallTask

__all__ = ["recall_accuracy", "recall_hits", "round_accuracies", "rounded"]


def rounded(x: SupportsFloat) -> float:
    """``x`` (a number or a one-element tensor) rounded to 4 decimals: every stored float."""
    return round(float(x), 4)


@torch.no_grad()
def recall_accuracy(
    model: torch.nn.Module,
    task: RecallTask,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    max_batch: int = 16,
) -> tuple[float, float]:
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


@torch.no_grad()
def recall_hits(
    model: torch.nn.Module,
    task: RecallTask,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    max_batch: int = 16,
) -> torch.Tensor:
    """Bool ``(answers,)``: whether the argmax over the value tokens is the answer, at every
    scored position, in row-major order (the order of :meth:`RecallTask.band_batch`'s
    ``distances``)."""
    model.eval()
    device = next(model.parameters()).device
    lo, hi = task.keys, task.keys + task.values
    out = []
    for start in range(0, len(inputs), max_batch):
        x = inputs[start : start + max_batch].to(device)
        y = targets[start : start + max_batch].to(device)
        w = weights[start : start + max_batch].to(device) > 0
        logits = model(x)[w]
        out.append((logits[:, lo:hi].argmax(-1) + lo == y[w]).cpu())
    return torch.cat(out)


def round_accuracies(
    model: torch.nn.Module,
    task: RecallTask,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
) -> dict[str, float]:
    """In-view accuracy of inputs from :meth:`RecallTask.batch`: over every round
    (``accuracy``) and over each round alone (``accuracy_round1``, ...), floats."""
    hits = recall_hits(model, task, inputs, targets, weights)
    length = inputs.shape[1]
    per_row = weights[0] > 0  # every row scores the same positions
    order = torch.nonzero(per_row).flatten()
    out = {"accuracy": rounded(hits.double().mean())}
    grid = hits.view(len(inputs), len(order))
    for r in range(task.rounds):
        cols = task.round_mask(length, r)[order]
        out[f"accuracy_round{r + 1}"] = rounded(grid[:, cols].double().mean())
    return out
