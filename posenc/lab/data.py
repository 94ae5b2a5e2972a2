"""Synthetic data with a known answer: a language with exact entropy, and a retrieval task.

Nothing here is downloaded; every sample comes from a seeded
:class:`torch.Generator`, so a seed fixes the data on every machine.

:class:`CopyVocabSource`
    A language whose per-token entropy is known exactly at every position.
    Each sequence draws a hidden *active vocabulary* ``S`` (``active`` of the
    ``vocab`` tokens, uniformly at random).  The first ``offset`` tokens are
    uniform draws from ``S``; after that, token ``t`` copies token
    ``t - offset`` with probability ``copy_prob`` and is otherwise a fresh
    uniform draw from ``S``.  Two dependencies, of two kinds:

    * the copy needs *relative position* (exactly ``offset`` back), and is local;
    * guessing ``S`` needs *all* the context and no position at all: the
      more distinct tokens a model has seen, the better it predicts fresh
      draws.  The source thus rewards long context, slowly.

    The posterior over ``S`` given a prefix is uniform over the ``active``-sized
    supersets of the set ``U`` of tokens seen so far (every factor of the
    likelihood is the same for every such superset), so the Bayes-optimal
    prediction at position ``t`` is exact (:meth:`CopyVocabSource.predictive`):
    ``copy_prob`` on token ``t - offset`` plus ``(1 - copy_prob)`` spread as
    ``1/active`` on each seen token and ``(active - u)/(active (vocab - u))``
    on each unseen one, with ``u = |U|``.  Its entropy depends only on ``u``,
    whose law is a small Markov chain, so the expected loss of the best
    possible model at every position, :meth:`CopyVocabSource.entropy_floor`,
    is computed exactly (float64), not estimated.

    The source is stationary given ``S`` (every token is uniform on ``S``),
    so a window cut from a long stream has the law of a fresh sample of the
    window's length: splitting a stream into windows and sampling windows
    afresh are the same experiment.

:class:`PasskeyTask`
    Far-context retrieval.  A sequence of uniform filler tokens hides one
    *value* token (one of ``values``) at a chosen distance from the end; the
    last token is a query marker, and the target at the query is the value.
    The task is solvable from content alone (a value token is recognisable
    wherever it sits), so a model that fails when the value sits far away
    fails because of how its positional scheme treats distance.
"""

from __future__ import annotations

import math
from typing import TypeAlias

import torch

from .._checks import check_float, check_int

__all__ = ["CopyVocabSource", "PasskeyTask"]

# The state of the exact floor: (u, pattern), u distinct tokens seen and the equality
# pattern of the recent tokens, newest first, as class labels (see _canonical).
_State: TypeAlias = tuple[int, tuple[int, ...]]


class CopyVocabSource:
    """The lab's language: recent-token copies plus a hidden active vocabulary (see module doc).

    Parameters
    ----------
    vocab
        Number of token ids, ``>= 2``.
    active
        Size of each sequence's hidden vocabulary ``S``, ``1 <= active <= vocab``.
    offsets
        Copy distances (distinct positive integers); a copy picks one of them
        uniformly.  ``(1, 2, 3)``: one of the last three tokens.
    copy_prob
        Probability ``pi`` in ``[0, 1)`` that a token at position
        ``t >= max(offsets)`` is a copy.
    """

    def __init__(
        self,
        vocab: int = 32,
        active: int = 6,
        offsets: tuple[int, ...] = (1, 2, 3),
        copy_prob: float = 0.5,
    ):
        self.vocab = check_int("vocab", vocab, minimum=2)
        self.active = check_int("active", active, minimum=1)
        if self.active > self.vocab:
            raise ValueError(f"active must be <= vocab={self.vocab}, got {self.active}")
        offsets = tuple(check_int("offsets", o, minimum=1) for o in offsets)
        if not offsets or len(set(offsets)) != len(offsets):
            raise ValueError(f"offsets must be distinct positive integers, got {offsets}")
        self.offsets = tuple(sorted(offsets))
        self.reach = max(self.offsets)  # copies start at this position
        self.copy_prob = check_float("copy_prob", copy_prob, minimum=0.0)
        if self.copy_prob >= 1.0:
            raise ValueError(f"copy_prob must be in [0, 1), got {self.copy_prob}")

    def sample(self, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """Token ids ``(batch, length)``, int64, drawn with ``generator``."""
        batch = check_int("batch", batch, minimum=1)
        length = check_int("length", length, minimum=1)
        g = generator
        # the hidden vocabulary: the first `active` ids of a random permutation, per row
        active_ids = torch.rand(batch, self.vocab, generator=g).argsort(-1)[:, : self.active]
        fresh = torch.gather(
            active_ids, 1, torch.randint(self.active, (batch, length), generator=g)
        )
        copy = torch.rand(batch, length, generator=g) < self.copy_prob
        copy[:, : self.reach] = False
        offsets = torch.tensor(self.offsets)
        pick = offsets[torch.randint(len(self.offsets), (batch, length), generator=g)]
        rows = torch.arange(batch)
        tokens = fresh.clone()
        for t in range(self.reach, length):  # sequential: a copy may copy a copy
            source = tokens[rows, t - pick[:, t]]
            tokens[:, t] = torch.where(copy[:, t], source, fresh[:, t])
        return tokens

    def predictive(self, tokens: torch.Tensor) -> torch.Tensor:
        """Exact Bayes-optimal next-token distribution at every position.

        ``tokens`` is ``(batch, length)``; returns float64 ``(batch, length, vocab)``
        whose row ``t`` is ``p(x_t = . | x_0 .. x_{t-1})``.
        """
        n = tokens.shape[1]
        v, s, pi = self.vocab, self.active, self.copy_prob
        onehot = torch.nn.functional.one_hot(tokens, v).to(torch.float64)
        seen_before = (onehot.cumsum(1) - onehot) > 0  # token y occurred before position t
        u = seen_before.sum(-1, keepdim=True).to(torch.float64)
        unseen_mass = torch.where(u < v, (s - u) / (s * (v - u).clamp(min=1)), 0.0)
        fresh = torch.where(seen_before, 1.0 / s, unseen_mass)
        out = fresh.clone()
        m = self.reach
        if n > m:
            recent = sum(onehot[:, m - o : n - o] for o in self.offsets) / len(self.offsets)
            out[:, m:] = (1 - pi) * fresh[:, m:] + pi * recent
        return out

    def entropy_floor(self, length: int) -> torch.Tensor:
        """Exact expected loss (nats) of the best possible model, per position: ``(length,)``.

        ``H(X_t | X_0 .. X_{t-1})`` in float64.  The predictive at ``t``
        depends on the prefix only through ``u`` (distinct tokens seen) and
        the equality pattern of the last ``max(offsets)`` tokens; the law of
        that pair is propagated exactly, one position at a time.
        """
        length = check_int("length", length, minimum=1)
        floor = torch.empty(length, dtype=torch.float64)
        law: dict[_State, float] = {
            (0, ()): 1.0
        }  # (u, canonical pattern of recent tokens, newest first) -> prob
        for t in range(length):
            copying = t >= self.reach
            floor[t] = math.fsum(p * self._entropy(u, pat, copying) for (u, pat), p in law.items())
            new_law: dict[_State, float] = {}
            for (u, pat), p in law.items():
                for (u2, pat2), q in self._moves(u, pat, copying):
                    key = (u2, pat2)
                    new_law[key] = new_law.get(key, 0.0) + p * q
            law = new_law
        return floor

    # -------------------------------------------------------------- exact floor internals

    def _masses(
        self, u: int, pat: tuple[int, ...], copying: bool
    ) -> tuple[dict[int, float], float, float]:
        """``(mass per recent class, mass per other seen token, mass per unseen token)``."""
        v, s, pi = self.vocab, self.active, self.copy_prob
        fresh = (1 - pi) if copying else 1.0
        counts: dict[int, int] = {}
        if copying:
            for o in self.offsets:
                counts[pat[o - 1]] = counts.get(pat[o - 1], 0) + 1
        classes = set(pat)
        recent = {c: fresh / s + pi * counts.get(c, 0) / len(self.offsets) for c in classes}
        unseen = fresh * (s - u) / (s * (v - u)) if u < v else 0.0
        return recent, fresh / s, unseen

    def _entropy(self, u: int, pat: tuple[int, ...], copying: bool) -> float:
        recent, seen, unseen = self._masses(u, pat, copying)
        others = u - len(recent)
        return -math.fsum(
            [_xlogx(m) for m in recent.values()]
            + [others * _xlogx(seen), (self.vocab - u) * _xlogx(unseen)]
        )

    def _moves(self, u: int, pat: tuple[int, ...], copying: bool) -> list[tuple[_State, float]]:
        """Successor states ``((u', pattern'), probability)`` after one more token."""
        recent, seen, unseen = self._masses(u, pat, copying)
        fresh_class = len(set(pat))  # a label no recent token has
        out = [((u, c), m) for c, m in recent.items()]  # the token is a recent class
        others = u - len(recent)
        if others:
            out.append(((u, fresh_class), others * seen))  # seen before, not recently
        if u < self.vocab and unseen > 0:
            out.append(((u + 1, fresh_class), (self.vocab - u) * unseen))  # new token
        keep = self.reach
        return [((u2, _canonical((c,) + pat)[:keep]), q) for (u2, c), q in out]

    def __repr__(self) -> str:
        return (
            f"CopyVocabSource(vocab={self.vocab}, active={self.active}, "
            f"offsets={self.offsets}, copy_prob={self.copy_prob})"
        )


def _canonical(pattern: tuple[int, ...]) -> tuple[int, ...]:
    """Relabel classes by first appearance, e.g. ``(5, 2, 5) -> (0, 1, 0)``."""
    labels: dict[int, int] = {}
    return tuple(labels.setdefault(c, len(labels)) for c in pattern)


def _xlogx(p: float) -> float:
    return p * math.log(p) if p > 0 else 0.0


class PasskeyTask:
    """Retrieve the one value token hidden among fillers (see module doc).

    Token ids: fillers ``0 .. fillers-1``, values ``fillers .. fillers+values-1``,
    the query marker ``fillers + values``; ``vocab`` is their count.

    Parameters
    ----------
    fillers, values
        Numbers of filler and value tokens (``>= 1`` and ``>= 2``).
    """

    def __init__(self, fillers: int = 32, values: int = 8):
        self.fillers = check_int("fillers", fillers, minimum=1)
        self.values = check_int("values", values, minimum=2)
        self.query = self.fillers + self.values
        self.vocab = self.query + 1

    def sample(
        self, batch: int, length: int, distances: tuple[int, int], generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(tokens (batch, length), answers (batch,), distance (batch,))``.

        The value sits ``d`` tokens before the query (the last token), with
        ``d`` uniform on ``distances = (lo, hi)`` inclusive, ``1 <= lo <= hi <= length - 1``.
        """
        batch = check_int("batch", batch, minimum=1)
        length = check_int("length", length, minimum=2)
        lo, hi = (check_int("distances", d, minimum=1) for d in distances)
        if not lo <= hi <= length - 1:
            raise ValueError(
                f"distances must satisfy 1 <= lo <= hi <= length - 1 = {length - 1}, "
                f"got ({lo}, {hi})"
            )
        g = generator
        tokens = torch.randint(self.fillers, (batch, length), generator=g)
        answers = self.fillers + torch.randint(self.values, (batch,), generator=g)
        distance = torch.randint(lo, hi + 1, (batch,), generator=g)
        tokens[torch.arange(batch), length - 1 - distance] = answers
        tokens[:, -1] = self.query
        return tokens, answers, distance

    def __repr__(self) -> str:
        return f"PasskeyTask(fillers={self.fillers}, values={self.values})"
