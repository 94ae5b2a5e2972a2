"""What the chapter states once the confirmation seeds have spoken.

Three frozen files state the lab's claims, each before the seeds that test it
were run: posenc/lab/propositions.py (the first freeze: presets ``full`` and
``recall``), posenc/lab/warmup_propositions.py (the second: ``recall-warmup``) and
posenc/lab/fflm_propositions.py (the third: ``fflm`` and ``fflm-length``, the PaTH
paper's flip-flop table).
A stated claim *replicates* when its raw verdict on its preset's confirmation set
is the stated one.  One that does not is **withdrawn**: the chapter reports its
numbers, says that it failed, and no longer states it.  The frozen files keep it
as it was stated, so the record of what was claimed before the runs stays intact.

:data:`WITHDRAWN` is that record.  It can only remove a stated claim, never add
one or turn its direction, and the tests keep it equal to the failures of the
stored confirmation sets, so it can neither hide a failure nor drop a claim that
replicated.  ``python -m posenc.lab --check`` decides what is left.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["DECLARED_SEEDS", "WITHDRAWN", "replication_tally"]

#: The stated claims each preset's confirmation set did not replicate, by preset:
#: ``{preset: {proposition name: its confirmation verdict and why}}``.  Written after
#: the confirmation runs; every other stated claim holds there as stated.
WITHDRAWN: dict[str, dict[str, str]] = {
    "full": {
        "large-base-yarn-beats-ntk": (
            "stated fails; inconclusive on seeds 5-14, mean -0.002 nats, 95% [-0.009, +0.005]: "
            "YaRN and NTK-aware scaling are within 0.01 nats at base 10^4 either way"
        ),
    },
    "recall": {
        # The first four need a model that learned the task; with the recall preset's
        # 150-step warmup RoPE learned on 0 of 10 seeds and xPos on 1 (the ablation in
        # recall-warmup.json: with 450 steps all 12 of its models learned).
        "learns-rope": "stated holds; fails on seeds 5-14, 0 of 10 seeds learned",
        "learns-xpos": "stated holds; fails on seeds 5-14, 1 of 10 seeds learned",
        "reach-xpos-L-2L-at-8L": "stated holds; fails on seeds 5-14, 0 of 10 seeds pass",
        "reach-rope:ntk-L-2L-at-8L": "stated holds; fails on seeds 5-14, 0 of 10 seeds pass",
        "reach-rope:yarn-L-2L-at-8L": "stated holds; fails on seeds 5-14, 0 of 10 seeds pass",
        "reach-rope:llama3-L-2L-at-8L": "stated holds; fails on seeds 5-14, 0 of 10 seeds pass",
    },
    "recall-warmup": {},
    # the third freeze (posenc.lab.fflm_propositions): the PaTH paper's near-zero cells
    # that its 400-step models did not reach (the paper trains 10,000 steps)
    "fflm": {
        "path-sparse-below-0.1pct": "stated holds; fails on seeds 35-44, 1 of 10 seeds pass",
        "rope-dense-below-0.1pct": "stated holds; fails on seeds 35-44, 0 of 10 seeds pass",
        "stickbreaking-dense-below-0.1pct": (
            "stated holds; fails on seeds 35-44, 0 of 10 seeds pass"
        ),
        "fox-dense-below-0.1pct": "stated holds; fails on seeds 35-44, 0 of 10 seeds pass",
        "path-dense-below-0.1pct": (
            "stated holds; inconclusive on seeds 35-44, 2 of 10 seeds pass"
        ),
    },
    "fflm-length": {},
    # the fourth freeze (posenc.lab.recipe_propositions): its language models on seeds 25-34
    "lm-budget": {},
    # the fourth freeze's recall claims on seeds 25-34: RoPE learned on 8 of 10 seeds, and
    # five gains' intervals straddle the smallest effect of interest (0.05)
    "recall-recipe": {
        "learns-rope": "stated holds; inconclusive on seeds 25-34, 8 of 10 seeds learned",
        "gain-none-L-2L-at-8L": (
            "stated fails; inconclusive on seeds 25-34, gain +0.048, 95% [+0.020, +0.076], "
            "Wilcoxon p 0.977"
        ),
        "gain-rope-L-2L-at-2L": (
            "stated holds; inconclusive on seeds 25-34, gain +0.088, 95% [+0.026, +0.149], "
            "Wilcoxon p 0.232"
        ),
        "gain-rope-L-2L-at-8L": (
            "stated holds; inconclusive on seeds 25-34, gain +0.031, 95% [+0.009, +0.053], "
            "Wilcoxon p 0.131"
        ),
        "gain-xpos-4L-8L-at-8L": (
            "stated holds; inconclusive on seeds 25-34, gain +0.101, 95% [+0.044, +0.158], "
            "Wilcoxon p 0.064"
        ),
        "gain-rope:pi-4L-8L-at-8L": (
            "stated holds; inconclusive on seeds 25-34, gain +0.071, 95% [+0.035, +0.108], "
            "Wilcoxon p 0.275"
        ),
    },
}

#: The seeds each freeze declared for its discovery and its confirmation set, by preset
#: and split: ``{preset: {split: (seed, ...)}}``.  Copied from the frozen files'
#: docstrings (propositions.py: discovery 0-4, confirmation 5-14 for ``full`` and
#: ``recall``; warmup_propositions.py: its ablation's seeds 5-10 chose the verdicts,
#: seeds 15-24 confirm them; fflm_propositions.py: no discovery set, seeds 35-44
#: confirm).  ``--check --split`` refuses results whose seeds are not
#: among them, so that a file saved under the wrong split cannot pass as the other.
DECLARED_SEEDS: dict[str, dict[str, tuple[int, ...]]] = {
    "full": {"discovery": tuple(range(5)), "confirmation": tuple(range(5, 15))},
    "recall": {"discovery": tuple(range(5)), "confirmation": tuple(range(5, 15))},
    "recall-warmup": {"discovery": tuple(range(5, 11)), "confirmation": tuple(range(15, 25))},
    # fflm_propositions.py: the PaTH paper chose the verdicts (no discovery set); seeds
    # 35-44 confirm them, for both flip-flop presets
    "fflm": {"confirmation": tuple(range(35, 45))},
    "fflm-length": {"confirmation": tuple(range(35, 45))},
    # recipe_propositions.py: stored runs of other presets chose the verdicts; seeds
    # 25-34 confirm them
    "recall-recipe": {"confirmation": tuple(range(25, 35))},
    "lm-budget": {"confirmation": tuple(range(25, 35))},
}


def replication_tally(verdicts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """How many frozen stated claims have their stated verdict, raw and after Holm.

    This is the headline of a pre-registered study: it counts every claim the
    freeze stated, withdrawn or not (:data:`WITHDRAWN` records what the chapter
    still states; it does not change what replicated).

    Parameters
    ----------
    verdicts
        Verdicts from :func:`posenc.lab.check` on one preset's results.

    Returns
    -------
    dict
        ``stated`` (how many verdicts have a stated one), ``replicated`` (raw verdict
        equal to the stated one), ``replicated_holm`` (verdict after Holm's correction
        equal to it) and ``failed`` (the names whose raw verdict differs, in order).

    Examples
    --------
    >>> from posenc.lab import check, load_results, propositions_for, replication_tally
    >>> verdicts = check(load_results("recall", split="confirmation"), propositions_for("recall"))
    >>> t = replication_tally(verdicts)
    >>> t["replicated"], t["stated"], len(t["failed"])
    (19, 25, 6)
    """
    stated = [v for v in verdicts if v.get("stated") is not None]
    return {
        "stated": len(stated),
        "replicated": sum(v["verdict"] == v["stated"] for v in stated),
        "replicated_holm": sum(v.get("verdict_holm") == v["stated"] for v in stated),
        "failed": [v["name"] for v in stated if v["verdict"] != v["stated"]],
    }
