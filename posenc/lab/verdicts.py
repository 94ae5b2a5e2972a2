"""The documented entry points to the frozen propositions.

Three files froze the lab's claims, each before the seeds that test it were run:
posenc/lab/propositions.py (commit c9ea503: presets ``full`` and ``recall``),
posenc/lab/warmup_propositions.py (commit 5988eee: ``recall-warmup``) and
posenc/lab/fflm_propositions.py (``fflm`` and ``fflm-length``: the PaTH paper's
flip-flop table).  Both stay
byte-for-byte as they were frozen: their SHA-256 is what the confirmation runs were
registered under, and the length-extrapolation chapter checks it, so not even a
docstring may change there.  Their propositions and rules are used as they are;
this module gives them their full documentation and examples, and is what
``posenc.lab`` exports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import fflm_propositions as _fflm
from . import propositions as _frozen
from . import recipe_propositions as _recipe
from . import warmup_propositions as _warmup

__all__ = ["PROPOSITIONS", "check", "failures", "frozen_hash", "propositions_for"]

# preset -> the frozen module that states its propositions
_FREEZES = {
    "full": _frozen, "recall": _frozen, "recall-warmup": _warmup, "fflm": _fflm,
    "fflm-length": _fflm, "recall-recipe": _recipe, "lm-budget": _recipe,
}  # fmt: skip

#: Every proposition of the first freeze (posenc/lab/propositions.py), frozen before the
#: confirmation runs, in the order :func:`check` reports them: the full preset's
#: (language modelling, passkey, sweeps), then the recall preset's (``learns-*``,
#: ``reach-*``).  :func:`propositions_for` gives those of one preset, either freeze.
PROPOSITIONS: tuple[_frozen.Proposition, ...] = _frozen.PROPOSITIONS


def _freeze(preset: str) -> Any:
    if preset not in _FREEZES:
        raise ValueError(
            f"preset must be one the propositions are about ({', '.join(_FREEZES)}), got {preset!r}"
        )
    return _FREEZES[preset]


def frozen_hash(preset: str = "full") -> str:
    """SHA-256 of the file that froze the claims about ``preset``.

    That file holds each proposition, its threshold, its stated verdict and the
    rules: posenc/lab/propositions.py for ``"full"`` and ``"recall"``,
    posenc/lab/warmup_propositions.py for ``"recall-warmup"``,
    posenc/lab/fflm_propositions.py for ``"fflm"`` and ``"fflm-length"``.

    Parameters
    ----------
    preset
        A preset the propositions are about: ``"full"``, ``"recall"``,
        ``"recall-warmup"``, ``"fflm"`` or ``"fflm-length"``.

    Returns
    -------
    The hex digest of the file's bytes (64 characters).

    Examples
    --------
    >>> from posenc.lab import frozen_hash
    >>> frozen_hash()[:12], frozen_hash("recall-warmup")[:12]
    ('61fc5a26025e', 'de1a4a3f44d2')
    """
    return str(_freeze(preset).frozen_hash())


def propositions_for(preset: str) -> tuple[Any, ...]:
    """The frozen propositions about ``preset``, in the order :func:`check` reports them.

    Parameters
    ----------
    preset
        ``"full"`` (language modelling, passkey, sweeps) or ``"recall"`` (``learns-*``,
        ``reach-*``), both from the first freeze; ``"recall-warmup"``, the second
        freeze's RoPE and xPos recall propositions restated for a 450-step warmup; or
        ``"fflm"`` and ``"fflm-length"``, the third freeze's flip-flop propositions
        (the PaTH paper's Table 1, and the length axis).

    Returns
    -------
    The propositions (frozen records, as in :data:`PROPOSITIONS`) whose ``preset`` is
    ``preset``.

    Examples
    --------
    >>> from posenc.lab import propositions_for
    >>> warmup = propositions_for("recall-warmup")
    >>> len(warmup), sum(p.stated is not None for p in warmup)
    (16, 12)
    """
    return tuple(p for p in _freeze(preset).PROPOSITIONS if p.preset == preset)


# The propositions are typed Any here: their class lives in the frozen module, whose
# docstrings cannot be completed, so the reference does not document it.
def check(
    results: Mapping[str, Any], propositions: Iterable[Any] = PROPOSITIONS
) -> list[dict[str, Any]]:
    """One verdict per proposition for ``results`` (a :func:`run_all` output or its ``results``).

    A proposition is checked when every experiment it reads has rows in
    ``results``; each seed of ``results`` gives a value, or none when its
    rows for that seed are missing (or, for a recall proposition, when it is
    not about that seed).  Every verdict then gets Holm's correction within its
    ``family``: the stated, or the reported, propositions of one preset.

    Parameters
    ----------
    results
        A :func:`run_all` output (as :func:`load_results` reads it), or its
        ``results``: ``{experiment: [row, ...]}``.
    propositions
        The propositions to decide, in order: items of :data:`PROPOSITIONS` (frozen
        records with ``name``, ``claim``, ``statistic``, ``threshold``, ``stated``,
        ``kind``, ``margin`` and ``experiments``); default all of them.

    Returns
    -------
    One dict per checked proposition, in the order of ``propositions``:
    ``name``, ``claim``, ``statistic``, ``kind``, ``values`` (one per seed that
    gave one, in seed order), ``seeds`` (how many), ``mean``, ``lo``, ``hi`` (the
    interval of the rule: 95% t, 90% t for an equivalence, 95% Clopper-Pearson
    for a rate, whose ``mean`` is ``k / n``), ``level``, ``threshold``,
    ``margin``, ``verdict`` (``"holds"``, ``"fails"``, ``"inconclusive"``, or
    ``"no rows"`` when no seed gave a value), ``p``, ``stated``, ``family``
    (``"<preset>, stated"`` or ``"<preset>, reported"``), and after Holm's
    correction ``p_holm`` (``None`` without rows) and ``verdict_holm``.  A rate's
    verdict also has ``k`` (the seeds that pass); an inconclusive one without an
    interval may have ``note`` (why).

    Examples
    --------
    >>> from posenc.lab import check, load_results
    >>> verdicts = check(load_results("full", split="confirmation"))
    >>> v = verdicts[0]
    >>> v["name"], v["kind"], v["seeds"], v["verdict"], v["stated"]
    ('sinusoidal-breaks', 'effect', 10, 'holds', 'holds')
    >>> print(f"mean {v['mean']:.3f}, 95% [{v['lo']:.3f}, {v['hi']:.3f}] vs {v['threshold']}")
    mean 0.286, 95% [0.267, 0.306] vs 0.1
    """
    propositions = tuple(propositions)
    recipe = [isinstance(p, _recipe.RecipeProposition) for p in propositions]
    if any(recipe):  # the fourth freeze has its own gain rule and families
        if not all(recipe):
            raise ValueError(
                "propositions must come from one freeze: the fourth freeze's "
                "(recall-recipe, lm-budget) decide by their own rules"
            )
        return _recipe.check(results, propositions)
    return _frozen.check(results, propositions)


def failures(verdicts: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The verdicts of stated propositions whose (raw) verdict is not the stated one.

    Parameters
    ----------
    verdicts
        Verdicts from :func:`check`.

    Returns
    -------
    Those whose ``stated`` is not ``None`` and differs from ``verdict``
    (Holm's correction aside), in the order given.

    Examples
    --------
    >>> from posenc.lab import check, failures, load_results
    >>> verdicts = check(load_results("full", split="confirmation"))
    >>> [v["name"] for v in failures(verdicts)]
    ['large-base-yarn-beats-ntk']
    """
    return _frozen.failures(verdicts)
