"""Batches for training and evaluation: next-token prediction and passkey retrieval.

A *task* turns a data source into ``(inputs, targets, weights)``:

* ``inputs``: int64 ``(batch, length)`` fed to the model;
* ``targets``: int64 ``(batch, length)``, the token to predict at each position;
* ``weights``: float ``(batch, length)``, 1 where the loss counts, 0 elsewhere.

:class:`LanguageTask` predicts every next token of a :class:`CopyVocabSource`
stream (position ``i`` predicts token ``i + 1``); :class:`RetrievalTask`
scores only the last position, where the hidden value of a
:class:`PasskeyTask` must be named; :class:`RecallTask` (multi-query
associative recall, see :mod:`posenc.lab.recall`) scores every query of its
final block.
"""

from __future__ import annotations

from typing import TypeAlias

import torch

from .._checks import check_float, check_int
from .data import CopyVocabSource, PasskeyTask

__all__ = ["LanguageTask", "LeadRecallTask", "RecallTask", "RetrievalTask"]

# (inputs, targets, weights), each (batch, length)
_Batch: TypeAlias = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class LanguageTask:
    """Next-token prediction on a :class:`CopyVocabSource`; ``vocab`` is the source's.

    Every position of every sequence is scored: position ``i`` predicts token
    ``i + 1``.  The attributes ``source`` and ``vocab`` hold the source and its
    number of token ids.

    Parameters
    ----------
    source
        The language to sample; default ``CopyVocabSource()`` (32 token ids,
        6 active per sequence, copies from 1 to 3 tokens back with
        probability 0.5).
    """

    def __init__(self, source: CopyVocabSource | None = None):
        self.source = CopyVocabSource() if source is None else source
        self.vocab = self.source.vocab

    def batch(self, batch: int, length: int, generator: torch.Generator) -> _Batch:
        """``(inputs, targets, weights)``, each ``(batch, length)``, from ``length + 1`` tokens."""
        length = check_int("length", length, minimum=1)
        x = self.source.sample(batch, length + 1, generator)
        return x[:, :-1], x[:, 1:], torch.ones(batch, length)

    def floor(self, length: int) -> torch.Tensor:
        """Best possible loss at input positions ``0 .. length-1`` (float64 ``(length,)``)."""
        return self.source.entropy_floor(check_int("length", length, minimum=1) + 1)[1:]

    def __repr__(self) -> str:
        return f"LanguageTask({self.source!r})"


class RetrievalTask:
    """Name the value hidden in a :class:`PasskeyTask` sequence, scored at the last position.

    The query marker is the last token; the model must name the value token
    hidden before it.  ``distances = (lo, hi)`` in :meth:`batch` bounds how far
    before the query the value sits; ``None`` means anywhere, ``(1, length - 1)``.
    The attributes ``passkey`` and ``vocab`` hold the task and its number of
    token ids.

    Parameters
    ----------
    passkey
        The sequences to sample; default ``PasskeyTask()`` (32 filler and 8 value
        tokens, plus the query marker: 41 token ids).
    """

    def __init__(self, passkey: PasskeyTask | None = None):
        self.passkey = PasskeyTask() if passkey is None else passkey
        self.vocab = self.passkey.vocab

    def batch(
        self,
        batch: int,
        length: int,
        generator: torch.Generator,
        distances: tuple[int, int] | None = None,
    ) -> _Batch:
        """``(inputs, targets, weights)``, each ``(batch, length)``: only the last position scored.

        Parameters
        ----------
        batch
            Number of sequences.
        length
            Tokens per sequence, query marker included (``>= 2``).
        generator
            The :class:`torch.Generator` every draw comes from.
        distances
            ``(lo, hi)``: the value sits ``d`` tokens before the query, ``d``
            uniform on ``lo .. hi`` (both included, ``1 <= lo <= hi <= length - 1``);
            ``None``: ``(1, length - 1)``.

        Returns
        -------
        ``inputs`` (int64 token ids), ``targets`` (int64, zero except the last
        column, the hidden value) and ``weights`` (float, 1 in the last column, 0
        elsewhere).
        """
        length = check_int("length", length, minimum=2)
        if distances is None:
            distances = (1, length - 1)
        tokens, answers, _ = self.passkey.sample(batch, length, distances, generator)
        targets = torch.zeros_like(tokens)
        targets[:, -1] = answers
        weights = torch.zeros(tokens.shape)
        weights[:, -1] = 1.0
        return tokens, targets, weights

    def __repr__(self) -> str:
        return f"RetrievalTask({self.passkey!r})"


class RecallTask:
    """Key-value recall among fillers (see the module doc).

    Parameters
    ----------
    pairs
        Key-value pairs per sequence (``>= 1``).
    keys, values
        Numbers of key and value tokens (``keys >= pairs``, ``values >= 2``).
        The fillers are value tokens too: a value is told from a filler only by
        its position, right after its key.
    rounds
        How many times the query block asks for every key, each round in a
        fresh order (``2 * pairs * rounds`` tokens).  Training scores every
        round; from the second round on, the answer also sits in the block a
        few tokens back, so those answers teach the same lookup at short range.
        The evaluations by distance score the first round only, whose answers
        lie before the block.
    """

    def __init__(self, pairs: int = 4, keys: int = 16, values: int = 16, rounds: int = 2):
        self.pairs = check_int("pairs", pairs, minimum=1)
        self.keys = check_int("keys", keys, minimum=self.pairs)
        self.values = check_int("values", values, minimum=2)
        self.rounds = check_int("rounds", rounds, minimum=1)
        self.vocab = self.keys + self.values
        self.block = 2 * self.pairs * self.rounds  # tokens of the query block

    # ------------------------------------------------------------------ pieces

    def _draw(self, batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys (batch, pairs), values (batch, pairs))``: distinct keys, independent values."""
        keys = torch.rand(batch, self.keys, generator=g).argsort(1)[:, : self.pairs]
        values = self.keys + torch.randint(self.values, (batch, self.pairs), generator=g)
        return keys, values

    def _fillers(self, batch: int, length: int, g: torch.Generator) -> torch.Tensor:
        return self.keys + torch.randint(self.values, (batch, length), generator=g)

    def _region(
        self, keys: torch.Tensor, values: torch.Tensor, length: int, g: torch.Generator
    ) -> torch.Tensor:
        """``(batch, length)`` fillers with the pairs ``k v`` at uniformly random places.

        The region is a random order of ``pairs`` two-token items and
        ``length - 2 pairs`` one-token fillers: choose which items are pairs,
        and pair ``j`` (in order) starts at its item index plus ``j``.
        """
        batch, n = keys.shape
        if length < 2 * n:
            raise ValueError(f"length must be at least 2 * pairs = {2 * n}, got {length}")
        tokens = self._fillers(batch, length, g)
        if n == 0:
            return tokens
        items = length - n
        starts = torch.rand(batch, items, generator=g).argsort(1)[:, :n].sort(1).values
        starts = starts + torch.arange(n)
        order = torch.rand(batch, n, generator=g).argsort(1)  # which pair goes where
        rows = torch.arange(batch)[:, None]
        tokens[rows, starts] = keys.gather(1, order)
        tokens[rows, starts + 1] = values.gather(1, order)
        return tokens

    def _queries(
        self, keys: torch.Tensor, values: torch.Tensor, g: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(block (batch, block), order (batch, pairs))``: ``rounds`` times every key then
        its value, each round in a fresh order; ``order`` is the first round's."""
        batch, n = keys.shape
        rounds: list[torch.Tensor] = []
        order: torch.Tensor | None = None
        for _ in range(self.rounds):
            perm = torch.rand(batch, n, generator=g).argsort(1)
            order = perm if order is None else order
            rounds.append(torch.stack((keys.gather(1, perm), values.gather(1, perm)), 2))
        assert order is not None  # rounds >= 1
        return torch.cat(rounds, 1).reshape(batch, self.block), order

    def _scored(self, tokens: torch.Tensor, mask: torch.Tensor) -> _Batch:
        """``(inputs, targets, weights)``: each query key predicts the value after it."""
        targets = torch.zeros_like(tokens)
        targets[:, :-1] = tokens[:, 1:]
        return tokens, targets * mask, mask.to(torch.get_default_dtype())

    # ------------------------------------------------------------------ samplers

    def batch(self, batch: int, length: int, generator: torch.Generator) -> _Batch:
        """Training batch ``(inputs, targets, weights)``, each ``(batch, length)``.

        Pairs anywhere in the first ``length - block`` tokens; ``weights`` is 1
        at every query key of the final block (``pairs * rounds`` scored answers per row).
        """
        batch = check_int("batch", batch, minimum=1)
        length = check_int("length", length, minimum=2 * self.pairs + self.block)
        keys, values = self._draw(batch, generator)
        region = self._region(keys, values, length - self.block, generator)
        block, _ = self._queries(keys, values, generator)
        tokens = torch.cat((region, block), 1)
        mask = torch.zeros(tokens.shape, dtype=torch.bool)
        mask[:, -self.block :: 2] = True
        return self._scored(tokens, mask)

    def lead(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        weights: torch.Tensor,
        fillers: int,
        generator: torch.Generator,
    ) -> _Batch:
        """The same scored inputs moved ``fillers`` positions later: ``fillers`` filler
        tokens (drawn from ``generator``) before each row, unscored.

        Every distance between two tokens of the original rows, and so every
        distance from a query to its key, is kept; only the positions counted from
        the input's start change.  Scoring a batch with and without a lead tells
        distance apart from position (the experiment ``recall_lead``).
        """
        fillers = check_int("fillers", fillers, minimum=0)
        if not (inputs.shape == targets.shape == weights.shape) or inputs.dim() != 2:
            raise ValueError(
                "inputs, targets and weights must share one (batch, length) shape, got "
                f"{tuple(inputs.shape)}, {tuple(targets.shape)}, {tuple(weights.shape)}"
            )
        front = self._fillers(inputs.shape[0], fillers, generator)
        return (
            torch.cat((front, inputs), 1),
            torch.cat((torch.zeros_like(front), targets), 1),
            torch.cat((weights.new_zeros(front.shape), weights), 1),
        )

    def band_batch(
        self, batch: int, length: int, lo: int, hi: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(inputs, targets, weights, distances)``: inputs of ``length`` tokens in which
        every first-round query's key lies ``lo`` to ``hi`` tokens before that query.

        The query block ends the input; the query of slot ``j`` of the first
        round (position ``length - block + 2 j``) asks for a key placed ``d``
        tokens before it, ``d`` uniform on the integers of
        ``[max(lo, 2 j + 2), min(hi, length - block + 2 j)]``: every pair lies
        before the block (``d >= 2 j + 2``) and inside the input.  Pairs never
        overlap (rows where two would are drawn again).  The first round is
        scored: ``pairs`` answers per row, in the order of their positions, and
        ``distances`` is int64 ``(batch, pairs)`` in that order (query position
        minus key position).  Raises ``ValueError`` naming ``hi`` or ``length``
        when no distance of the band fits.
        """
        batch = check_int("batch", batch, minimum=1)
        length = check_int("length", length, minimum=2 * self.pairs + self.block)
        lo = check_int("lo", lo, minimum=1)
        hi = check_int("hi", hi, minimum=lo)
        n, g = self.pairs, generator
        queries = [length - self.block + 2 * j for j in range(n)]
        bounds = [(max(lo, 2 * j + 2), min(hi, queries[j])) for j in range(n)]
        for j, (a, b) in enumerate(bounds):
            if a > b:
                raise ValueError(
                    f"hi must allow a distance of at least {2 * j + 2} and length one of at "
                    f"least {lo} before query {j}; got lo={lo}, hi={hi}, length={length}"
                )
        keys, values = self._draw(batch, g)
        block, order = self._queries(keys, values, g)
        dist = torch.empty(batch, n, dtype=torch.long)
        todo = torch.arange(batch)
        for _ in range(10_000):
            for j, (a, b) in enumerate(bounds):
                dist[todo, j] = torch.randint(a, b + 1, (len(todo),), generator=g)
            pos = torch.tensor(queries)[None, :] - dist  # key positions
            gap = (pos[:, :, None] - pos[:, None, :]).abs() + 2 * torch.eye(n, dtype=torch.long)
            todo = torch.nonzero((gap < 2).any(-1).any(-1)).flatten()
            if len(todo) == 0:
                break
        else:  # pragma: no cover - only for bands too narrow to hold the pairs apart
            raise ValueError(f"the band [{lo}, {hi}] is too narrow to hold {n} pairs apart")
        tokens = torch.cat((self._fillers(batch, length - self.block, g), block), 1)
        rows = torch.arange(batch)[:, None]
        asked = order  # slot j of the first round asks for pair order[:, j]
        tokens[rows, pos] = keys.gather(1, asked)
        tokens[rows, pos + 1] = values.gather(1, asked)
        mask = torch.zeros(tokens.shape, dtype=torch.bool)
        mask[:, torch.tensor(queries)] = True
        inputs, targets, weights = self._scored(tokens, mask)
        return inputs, targets, weights, dist

    def round_mask(self, length: int, round_: int) -> torch.Tensor:
        """Bool ``(length,)``: the scored query positions of round ``round_`` (0-based) in an
        input of :meth:`batch` (the in-view inputs score every round)."""
        length = check_int("length", length, minimum=self.block)
        round_ = check_int("round_", round_, minimum=0)
        if round_ >= self.rounds:
            raise ValueError(f"round_ must be below rounds={self.rounds}, got {round_}")
        mask = torch.zeros(length, dtype=torch.bool)
        start = length - self.block + 2 * self.pairs * round_
        mask[start : start + 2 * self.pairs : 2] = True
        return mask

    def needle_batch(
        self, batch: int, length: int, depth: float, generator: torch.Generator
    ) -> _Batch:
        """``(inputs, targets, weights)`` ``(batch, length)``: the needle pair at ``depth``.

        ``depth`` in ``[0, 1]`` places the needle's key at position
        ``round(depth * (length - block - 2))``: 0 is the first token, 1 is
        just before the query block.  The other ``pairs - 1`` pairs lie at
        random elsewhere before the block; only the needle's query in the
        first round is scored.
        """
        batch = check_int("batch", batch, minimum=1)
        length = check_int("length", length, minimum=2 * self.pairs + self.block)
        depth = check_float("depth", depth)
        if not 0 <= depth <= 1:
            raise ValueError(f"depth must lie in [0, 1], got {depth}")
        keys, values = self._draw(batch, generator)
        free = length - self.block - 2
        region = self._region(keys[:, 1:], values[:, 1:], free, generator)
        at = round(depth * free)
        needle = torch.stack((keys[:, 0], values[:, 0]), 1)
        block, order = self._queries(keys, values, generator)
        tokens = torch.cat((region[:, :at], needle, region[:, at:], block), 1)
        mask = torch.zeros(tokens.shape, dtype=torch.bool)
        slot = (order == 0).int().argmax(1)  # where the needle's key is queried
        mask[torch.arange(batch), length - self.block + 2 * slot] = True
        return self._scored(tokens, mask)

    def __repr__(self) -> str:
        return (
            f"RecallTask(pairs={self.pairs}, keys={self.keys}, values={self.values}, "
            f"rounds={self.rounds})"
        )


class LeadRecallTask:
    """A recall task's training batches, each moved by a random number of fillers.

    The data of the trained window-of-``L`` control (``LabConfig.recall_control_schemes``):
    every call draws the task's own batch of ``length`` tokens from the caller's
    generator, then puts ``n`` filler tokens before every row (:meth:`RecallTask.lead`),
    ``n`` uniform on ``0 .. max_lead`` and the fillers drawn from a generator of its
    own.  So the recall batches are exactly those the same data seed gives the full
    model, in the same order; only the lead differs, and every query keeps its pairs
    within ``length`` tokens while its position from the start reaches
    ``length + max_lead``.

    Parameters
    ----------
    task
        The recall task whose batches are moved.
    max_lead
        The largest lead, in tokens (``>= 0``).
    seed
        Seed of the leads and their fillers.
    """

    def __init__(self, task: RecallTask, max_lead: int, seed: int) -> None:
        if not isinstance(task, RecallTask):
            raise TypeError(f"task must be a RecallTask, got {type(task).__name__}")
        self.task = task
        self.max_lead = check_int("max_lead", max_lead, minimum=0)
        self.vocab = task.vocab
        self._generator = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))

    def batch(self, batch: int, length: int, generator: torch.Generator) -> _Batch:
        """``(inputs, targets, weights)``, each ``(batch, length + n)``: the task's batch of
        ``length`` tokens after ``n`` unscored fillers, ``n`` drawn per call."""
        inputs, targets, weights = self.task.batch(batch, length, generator)
        n = int(torch.randint(self.max_lead + 1, (1,), generator=self._generator))
        return self.task.lead(inputs, targets, weights, n, self._generator)

    def __repr__(self) -> str:
        return f"LeadRecallTask({self.task!r}, max_lead={self.max_lead})"
