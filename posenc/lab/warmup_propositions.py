"""The second freeze: RoPE's and xPos' recall claims restated for a 450-step warmup.

This file is frozen like posenc/lab/propositions.py (the first freeze), and for the
same reason: it was committed before any run of the seeds that test it, and the
chapter prints its SHA-256 (:func:`frozen_hash`).  Not a byte of it may change.

**Why a second freeze.**  Of the first freeze's 25 stated recall claims, six failed on
the confirmation seeds (5-14), all about RoPE and xPos: neither learned the task
with the recall preset's 150-step warmup (0 of 10 and 1 of 10 seeds).  The warmup
ablation (``posenc/lab/results/recall-warmup.json``, preset ``recall-warmup``:
warmup 450 steps, nothing else changed, seeds 5-10, rule committed in d1f98f2 before
the run) found that the warmup decides: 12 of 12 models learned, none of their
twins did.  The first freeze's claims about these schemes therefore stay failed as
they were stated.  What this file states is a *new* claim about another preset, and
the ablation is its discovery set: it chose these verdicts, so it cannot confirm them.

**What is stated, and by which rule.**  Every recall proposition of the first freeze
about ``rope``, ``rope:<method>`` or ``xpos``, unchanged (claim, statistic, per-seed
rule, threshold 1/2, the rate test), on preset ``recall-warmup``.  The stated verdict
was set mechanically from the ablation's six seeds: **holds** where 6 of 6 passed,
**fails** where 0 of 6 did, and nothing stated (reported) otherwise.  That gives 7
stated as holding, 5 as failing and 4 reported.

**The confirmation run** (after this file was committed; seeds no run has used for
these schemes with either warmup)::

    python -m posenc.lab --preset recall-warmup --seeds 15-24 --schemes rope,xpos \\
        --split confirmation --jobs 2 --threads 1 --no-plots

Its verdicts use the first freeze's rules (:func:`posenc.lab.propositions.check`):
with 10 seeds a rate holds at 9 of 10 and fails at 1 of 10; Holm's correction runs
within this file's stated propositions (family ``"recall-warmup, stated"``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from . import propositions as _first

__all__ = ["PROPOSITIONS", "frozen_hash"]

#: The preset these propositions are about.
PRESET = "recall-warmup"

#: Each proposition's stated verdict, from the ablation's 6 seeds (holds: 6 of 6 passed;
#: fails: 0 of 6; ``None``: anything between).
STATED: dict[str, str | None] = {
    "learns-rope": "holds",
    "learns-xpos": "holds",
    "reach-rope-L-2L-at-2L": None,  # 1 of 6
    "reach-rope-L-2L-at-8L": "fails",
    "reach-rope-4L-8L-at-8L": "fails",
    "reach-xpos-L-2L-at-2L": "holds",
    "reach-xpos-L-2L-at-8L": None,  # 3 of 6
    "reach-xpos-4L-8L-at-8L": "fails",
    "reach-rope:ntk-L-2L-at-8L": "holds",
    "reach-rope:ntk-4L-8L-at-8L": None,  # 1 of 6
    "reach-rope:yarn-L-2L-at-8L": "holds",
    "reach-rope:yarn-4L-8L-at-8L": None,  # 4 of 6
    "reach-rope:llama3-L-2L-at-8L": "holds",
    "reach-rope:llama3-4L-8L-at-8L": "holds",
    "reach-rope:pi-L-2L-at-8L": "fails",
    "reach-rope:pi-4L-8L-at-8L": "fails",
}


@dataclasses.dataclass(frozen=True)
class WarmupProposition(_first.Proposition):
    """A first-freeze recall proposition, restated for the ``recall-warmup`` preset."""

    @property
    def preset(self) -> str:
        """``"recall-warmup"``: Holm's family and ``--check`` go by it."""
        return PRESET


_BY_NAME = {p.name: p for p in _first.PROPOSITIONS}

#: The restated propositions, in the first freeze's order.
PROPOSITIONS: tuple[WarmupProposition, ...] = tuple(
    WarmupProposition(
        **{f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.name != "stated"},
        stated=STATED[p.name],
    )
    for p in _first.PROPOSITIONS
    if p.name in STATED
)


def frozen_hash() -> str:
    """SHA-256 of this file (the restated propositions, their verdicts and their rule)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
