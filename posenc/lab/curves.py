"""The curves researchers look at: loss by position in the context, and sliding windows.

:func:`positions` bins the per-position loss of every scheme at every
evaluation length ``f L``; :func:`sliding` scores the same long streams with
non-overlapping windows and with a sliding window, the distinction Press et
al. (2022) draw when they evaluate ALiBi.  Both return tidy rows (floats
rounded with :func:`~posenc.lab.lab.rounded`).
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F

from .lab import Lab, Row, rounded
from .train import seed_for

__all__ = ["DESCRIPTIONS", "EXPERIMENTS", "positions", "sliding", "window_plan"]

# windows scored per model call: memory grows with this times length**2 (attention weights)
_MAX_WINDOWS = 8


def positions(lab: Lab) -> list[Row]:
    """Loss by position within the context, binned, at every evaluation length, every scheme.

    The sequences are those of ``extrapolation`` (:meth:`Lab.lm_loss`: fresh
    samples of length ``f L``).  Positions are binned ``max(1, L // 4)`` at a
    time to keep the stored table small.  Row fields: ``scheme``, ``factor``,
    ``length``, ``start`` (first position of the bin), ``loss`` (the bin's
    mean loss) and ``floor`` (the bin's mean entropy floor).
    """
    c = lab.config
    width = max(1, c.train_len // 4)
    rows: list[Row] = []
    for scheme in c.schemes:
        model, _ = lab.model("lm", scheme)
        for f in c.eval_factors:
            n = f * c.train_len
            loss = lab.lm_loss(model, n)
            floor = lab.lm.floor(n)
            for start in range(0, n, width):
                rows.append(
                    {
                        "scheme": scheme,
                        "factor": f,
                        "length": n,
                        "start": start,
                        "loss": rounded(loss[start : start + width].mean()),
                        "floor": rounded(floor[start : start + width].mean()),
                    }
                )
    return rows


def window_plan(total: int, length: int, stride: int) -> list[tuple[int, int]]:
    """Windows over a stream of ``total`` scored positions: ``[(start, first), ...]``.

    Window ``(start, first)`` feeds stream positions ``start .. start + length - 1``
    and scores its positions ``first .. length - 1`` (relative to ``start``).
    Windows advance by ``stride``; each scores only the positions it adds, the
    first scores all of them, and a last window ending at ``total`` is added
    when the stride does not reach it.  So every position is scored exactly
    once, and every position after the first window has at least
    ``length - stride`` positions of context.  ``stride == length`` gives
    non-overlapping windows (``total`` must then be a multiple of ``length``
    for them to tile the stream).
    """
    if not 1 <= length <= total:
        raise ValueError(f"length must be in [1, total={total}], got {length}")
    if not 1 <= stride <= length:
        raise ValueError(f"stride must be in [1, length={length}], got {stride}")
    plan, end = [(0, 0)], length  # end: first position not yet scored
    while end < total:
        start = min(end + stride, total) - length
        plan.append((start, end - start))
        end = start + length
    return plan


@torch.no_grad()
def _window_losses(
    model: torch.nn.Module, windows: torch.Tensor, device: torch.device
) -> torch.Tensor:
    """Per-position loss of int64 ``windows (k, n + 1)`` (inputs ``[:, :-1]``): float64 ``(k, n)``.

    At most :data:`_MAX_WINDOWS` windows per model call: bounded memory.
    """
    out: list[torch.Tensor] = []
    for chunk in windows.split(_MAX_WINDOWS):
        chunk = chunk.to(device)
        logits = model(chunk[:, :-1])
        ce = F.cross_entropy(logits.transpose(1, 2).float(), chunk[:, 1:], reduction="none")
        out.append(ce.to("cpu", torch.float64))
    return torch.cat(out)


def _nonoverlapping(
    model: torch.nn.Module, streams: torch.Tensor, length: int, device: torch.device
) -> torch.Tensor:
    """Each stream's mean loss, cut into consecutive windows of ``length``: float64 ``(count,)``.

    ``streams`` is int64 ``(count, T + 1)`` with ``T`` a multiple of ``length``:
    inputs are positions ``0 .. T-1``, position ``t`` predicts token ``t + 1``.
    """
    count, total = streams.shape[0], streams.shape[1] - 1
    windows = streams.unfold(1, length + 1, length).reshape(-1, length + 1)
    return _window_losses(model, windows, device).view(count, total).mean(1)


def _sliding(
    model: torch.nn.Module, streams: torch.Tensor, length: int, stride: int, device: torch.device
) -> torch.Tensor:
    """Each stream's mean loss, scored by the windows of :func:`window_plan`: ``(count,)``."""
    count, total = streams.shape[0], streams.shape[1] - 1
    plan = window_plan(total, length, stride)
    windows = torch.stack([streams[:, a : a + length + 1] for a, _ in plan], 1)
    ce = _window_losses(model, windows.reshape(-1, length + 1), device).view(count, len(plan), -1)
    # a plan has at least one window: the sum is a tensor, never sum's start value 0
    sums = cast(torch.Tensor, sum(ce[:, k, first:].sum(1) for k, (_, first) in enumerate(plan)))
    return sums / total


def sliding(lab: Lab) -> list[Row]:
    """The same tokens scored with non-overlapping windows and with a sliding window.

    For every scheme and evaluation length ``n = f L``, fresh streams of
    ``T = 4 n`` scored tokens (``max(8, ceil(eval_tokens / T))`` of them, the
    same streams for every scheme) are scored two ways: ``"nonoverlapping"``
    windows of ``n`` (a token's context is its offset inside its window), and
    ``"sliding"`` windows of ``n`` advancing by
    ``stride = max(1, round(sliding_stride * n))``, each scoring only the
    tokens it adds (:func:`window_plan`), so every token after the first
    window sees at least ``n - stride`` tokens of context.

    Streams are right here, though a window cut from a stream does not have
    the law of a fresh sample of its length (the source's first tokens are
    never copies): both evaluations score the *same* tokens of the *same*
    streams, and ``floor`` is the mean entropy floor of those stream positions
    (``lab.lm.floor(T)``), the same for both, which a model that saw the whole
    stream as context would reach.  Rows: ``scheme``, ``factor``, ``length``,
    ``window``, ``loss``, ``floor`` and ``eval_se`` (standard error of the
    loss over streams).
    """
    c = lab.config
    rows: list[Row] = []
    data: dict[int, tuple[torch.Tensor, float]] = {}
    for f in c.eval_factors:  # drawn once: every scheme scores the same streams
        n = f * c.train_len
        total = 4 * n
        count = max(8, math.ceil(c.eval_tokens / total))
        gen = torch.Generator().manual_seed(seed_for(c.seed, "sliding", n))
        streams = lab.lm.source.sample(count, total + 1, gen)
        data[f] = streams, lab.lm.floor(total).mean().item()
    for scheme in c.schemes:
        model, _ = lab.model("lm", scheme)
        for f in c.eval_factors:
            n = f * c.train_len
            streams, floor = data[f]
            stride = max(1, round(c.sliding_stride * n))
            for window in ("nonoverlapping", "sliding"):
                if window == "nonoverlapping":
                    each = _nonoverlapping(model, streams, n, lab.device)
                else:
                    each = _sliding(model, streams, n, stride, lab.device)
                rows.append(
                    {
                        "scheme": scheme,
                        "factor": f,
                        "length": n,
                        "window": window,
                        "loss": rounded(each.mean()),
                        "floor": rounded(floor),
                        "eval_se": rounded(each.std().item() / math.sqrt(len(each))),
                    }
                )
    return rows


EXPERIMENTS = {"positions": positions, "sliding": sliding}

DESCRIPTIONS = {
    "positions": "loss by position within the context at every evaluation length, every scheme",
    "sliding": "the same stream tokens scored with non-overlapping windows and a sliding "
    "window, every scheme and length",
}
