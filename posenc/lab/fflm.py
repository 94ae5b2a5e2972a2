"""Flip-flop language modelling (FFLM), generated on the fly from a seeded generator.

The task of Liu, Ash, Goel, Krishnamurthy and Zhang, "Exposing Attention Glitches
with Flip-Flop Language Modeling" (NeurIPS 2023, arXiv 2306.00946), and the table the
PaTH paper reports on it (Yang et al., NeurIPS 2025, arXiv 2505.16381, §4.1).

A sequence is a run of (instruction, bit) pairs over the alphabet
``w r i 0 1``:

* ``w b`` writes the bit ``b`` into a one-bit memory;
* ``r b`` reads it: ``b`` must equal the most recently written bit;
* ``i b`` is a distraction: its bit is drawn at random and ignored.

The first instruction is always ``w`` and the last always ``r``; the ones in
between are drawn independently, ``i`` with probability ``p_ignore`` and ``w`` and ``r``
with ``(1 - p_ignore) / 2`` each (the paper's FFL(p_i)). Written and ignored bits
are fair coin flips. Only a read's bit is determined by what came before, so
only the bits after a read are scored (:class:`FlipFlopTask`).

The usual settings: train on FFL(0.8) and evaluate on FFL(0.8) (in distribution),
FFL(0.98) (sparse: long gaps between a write and its read) and FFL(0.1) (dense).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .._checks import check_float, check_int

__all__ = ["FFLM_TOKENS", "FlipFlopTask", "flip_flop", "read_errors"]

#: Token ids of the alphabet, in the order the model's vocabulary holds them.
FFLM_TOKENS = {"w": 0, "r": 1, "i": 2, "0": 3, "1": 4}
_W, _R, _I, _ZERO = FFLM_TOKENS["w"], FFLM_TOKENS["r"], FFLM_TOKENS["i"], FFLM_TOKENS["0"]


def flip_flop(
    batch: int, length: int, p_ignore: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` flip-flop sequences of ``length`` tokens, and where their reads' bits are.

    Parameters
    ----------
    batch
        Number of sequences.
    length
        Tokens per sequence: an even number of at least 4 (one write and one read).
    p_ignore
        Probability of ``i`` for each instruction between the first (``w``) and the
        last (``r``), in ``[0, 1)``; ``w`` and ``r`` take ``(1 - p_ignore) / 2`` each.
    generator
        The random source; the same generator state gives the same sequences.

    Returns
    -------
    tokens : torch.Tensor
        int64 ``(batch, length)``, ids of :data:`FFLM_TOKENS`: instructions at even
        positions, bits at odd ones.
    read_bits : torch.Tensor
        bool ``(batch, length)``, True at the bit of every read: the positions whose
        token is determined by the sequence before them.

    Examples
    --------
    >>> import torch
    >>> tokens, reads = flip_flop(1, 8, 0.5, torch.Generator().manual_seed(0))
    >>> ids = {v: k for k, v in FFLM_TOKENS.items()}
    >>> "".join(ids[t] for t in tokens[0].tolist())
    'w1w1i1r1'
    >>> reads[0].nonzero().flatten().tolist()   # the bit of the last read
    [7]
    """
    batch = check_int("batch", batch, minimum=1)
    length = check_int("length", length, minimum=4)
    if length % 2:
        raise ValueError(f"length must be even (instruction, bit pairs), got {length}")
    p_ignore = check_float("p_ignore", p_ignore, minimum=0.0)
    if not p_ignore < 1.0:
        raise ValueError(f"p_ignore must be in [0, 1) so that a read can follow, got {p_ignore}")
    pairs = length // 2
    # the middle instructions: i with p_ignore, else w or r with equal odds
    u = torch.rand(batch, pairs, generator=generator, dtype=torch.float64)
    ops = torch.where(u < p_ignore, _I, torch.where(u < (1 + p_ignore) / 2, _W, _R))
    ops[:, 0], ops[:, -1] = _W, _R
    bits = torch.randint(0, 2, (batch, pairs), generator=generator)
    # a read returns the bit of the latest write: carry each write's index forward
    index = torch.arange(pairs).expand(batch, pairs)
    last_write = torch.where(ops == _W, index, 0).cummax(dim=1).values
    reads = ops == _R
    bits = torch.where(reads, bits.gather(1, last_write), bits)
    tokens = torch.stack((ops, bits + _ZERO), dim=2).reshape(batch, length)
    read_bits = torch.stack((torch.zeros_like(reads), reads), dim=2).reshape(batch, length)
    return tokens, read_bits


class FlipFlopTask:
    """FFL(``p_ignore``) as a lab task: ``(inputs, targets, weights)``, each ``(batch, length)``.

    A sequence of ``length + 1`` tokens is drawn with :func:`flip_flop`
    (``length + 1`` even); position ``t`` of the inputs predicts token ``t + 1``,
    and ``weights`` is 1 exactly where that token is a read's bit, the only tokens
    the sequence determines, so a loss or an error rate counts those alone.

    Parameters
    ----------
    p_ignore
        The probability of the ``i`` instruction: 0.8 for the usual training and
        in-distribution data, 0.98 for sparse and 0.1 for dense evaluation.

    Examples
    --------
    >>> import torch
    >>> task = FlipFlopTask(0.8)
    >>> x, y, w = task.batch(2, 511, torch.Generator().manual_seed(0))
    >>> x.shape, y.shape, w.shape, task.vocab
    (torch.Size([2, 511]), torch.Size([2, 511]), torch.Size([2, 511]), 5)
    >>> bool((x[:, 1:] == y[:, :-1]).all())
    True
    """

    vocab = len(FFLM_TOKENS)

    def __init__(self, p_ignore: float):
        self.p_ignore = check_float("p_ignore", p_ignore, minimum=0.0)
        if not self.p_ignore < 1.0:
            raise ValueError(f"p_ignore must be in [0, 1), got {p_ignore}")

    def batch(
        self, batch: int, length: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(inputs, targets, weights)`` from ``length + 1`` tokens (``length`` odd)."""
        length = check_int("length", length, minimum=3)
        if length % 2 == 0:
            raise ValueError(
                f"length must be odd, so that the length + 1 tokens form whole pairs, got {length}"
            )
        tokens, read_bits = flip_flop(batch, length + 1, self.p_ignore, generator)
        weights = read_bits[:, 1:].to(torch.get_default_dtype())
        return tokens[:, :-1], tokens[:, 1:], weights

    def __repr__(self) -> str:
        return f"FlipFlopTask(p_ignore={self.p_ignore})"


# maps int64 tokens (batch, length) to logits (batch, length, vocab)
_Logits = Callable[[torch.Tensor], torch.Tensor]


@torch.no_grad()
def read_errors(
    model: _Logits | torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    *,
    max_batch: int = 16,
) -> tuple[int, int, float]:
    """How many reads ``model`` gets wrong: ``(reads, errors, loss)``.

    Parameters
    ----------
    model
        Maps int64 tokens ``(batch, length)`` to logits ``(batch, length, vocab)``:
        a :class:`~posenc.lab.TinyDecoder` (put in eval mode here) or any function.
    inputs, targets, weights
        From :meth:`FlipFlopTask.batch <posenc.lab.FlipFlopTask.batch>`, each
        ``(batch, length)``: ``weights`` is 1 exactly where ``targets`` is a read's bit.
    max_batch
        Sequences per forward pass (bounds the memory of the attention weights).

    Returns
    -------
    reads : int
        The scored positions (``weights > 0``).
    errors : int
        Those where the argmax of the logits over the whole vocabulary is not the
        target (the first maximal token on a tie).
    loss : float
        The mean cross-entropy at the scored positions, nats per read, accumulated in
        float64 (NaN when nothing is scored).

    Examples
    --------
    A function that names the last written bit at every position never errs; one
    that always says ``1`` errs on about half the reads:

    >>> import torch
    >>> from posenc.lab import FFLM_TOKENS, FlipFlopTask
    >>> from posenc.lab.fflm import read_errors
    >>> x, y, w = FlipFlopTask(0.8).batch(64, 511, torch.Generator().manual_seed(0))
    >>> def oracle(tokens):
    ...     written = torch.zeros(tokens.shape, dtype=torch.long)
    ...     last = torch.zeros(tokens.shape[0], dtype=torch.long)
    ...     for t in range(1, tokens.shape[1]):  # the bit after each w
    ...         is_write = tokens[:, t - 1] == FFLM_TOKENS["w"]
    ...         last = torch.where(is_write, tokens[:, t], last)
    ...         written[:, t] = last
    ...     return torch.nn.functional.one_hot(written, 5).double()
    >>> reads, errors, _ = read_errors(oracle, x, y, w)
    >>> reads == int(w.sum()), errors
    (True, 0)
    >>> ones = lambda tokens: torch.nn.functional.one_hot(
    ...     torch.full(tokens.shape, FFLM_TOKENS["1"]), 5).double()
    >>> 0.4 < read_errors(ones, x, y, w)[1] / reads < 0.6
    True
    """
    max_batch = check_int("max_batch", max_batch, minimum=1)
    if not inputs.shape == targets.shape == weights.shape or inputs.dim() != 2:
        raise ValueError(
            "inputs, targets and weights must share one shape (batch, length), got "
            f"{tuple(inputs.shape)}, {tuple(targets.shape)} and {tuple(weights.shape)}"
        )
    if isinstance(model, torch.nn.Module):
        model.eval()
    device = inputs.device
    if isinstance(model, torch.nn.Module):
        device = next(iter(model.parameters()), inputs).device
    reads = errors = 0
    total = 0.0
    for start in range(0, len(inputs), max_batch):
        chunk = slice(start, start + max_batch)
        x, y = inputs[chunk].to(device), targets[chunk].to(device)
        scored = weights[chunk].to(device) > 0
        logits = model(x)[scored]  # (reads, vocab)
        wanted = y[scored]
        reads += int(scored.sum())
        errors += int((logits.argmax(-1) != wanted).sum())
        ce = F.cross_entropy(logits.double(), wanted, reduction="sum")
        total += float(ce)
    return reads, errors, total / reads if reads else math.nan
