"""Batches for training and evaluation: next-token prediction and passkey retrieval.

A *task* turns a data source into ``(inputs, targets, weights)``:

* ``inputs``: int64 ``(batch, length)`` fed to the model;
* ``targets``: int64 ``(batch, length)``, the token to predict at each position;
* ``weights``: float ``(batch, length)``, 1 where the loss counts, 0 elsewhere.

:class:`LanguageTask` predicts every next token of a :class:`CopyVocabSource`
stream (position ``i`` predicts token ``i + 1``); :class:`RetrievalTask`
scores only the last position, where the hidden value of a
:class:`PasskeyTask` must be named.
"""

from __future__ import annotations

import torch

from .._checks import check_int
from .data import CopyVocabSource, PasskeyTask

__all__ = ["LanguageTask", "RetrievalTask"]


class LanguageTask:
    """Next-token prediction on a :class:`CopyVocabSource`; ``vocab`` is the source's."""

    def __init__(self, source: CopyVocabSource | None = None):
        self.source = CopyVocabSource() if source is None else source
        self.vocab = self.source.vocab

    def batch(self, batch: int, length: int, generator: torch.Generator):
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

    ``distances = (lo, hi)`` bounds how far before the query the value sits;
    ``None`` means anywhere, ``(1, length - 1)``.
    """

    def __init__(self, passkey: PasskeyTask | None = None):
        self.passkey = PasskeyTask() if passkey is None else passkey
        self.vocab = self.passkey.vocab

    def batch(self, batch: int, length: int, generator: torch.Generator, distances=None):
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
