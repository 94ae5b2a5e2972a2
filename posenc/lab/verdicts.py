"""The documented entry points to the frozen propositions of posenc/lab/propositions.py.

That file stays byte-for-byte as it was frozen (commit c9ea503): its SHA-256 is what
the confirmation runs were registered under, and the length-extrapolation chapter
checks it, so not even a docstring may change there.  Its propositions and rules are
used as they are; this module gives them their full documentation and examples, and
is what ``posenc.lab`` exports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import propositions as _frozen

__all__ = ["PROPOSITIONS", "check", "failures", "frozen_hash"]

#: Every proposition of the chapter, frozen before the confirmation runs, in the order
#: :func:`check` reports them: the full preset's (language modelling, passkey, sweeps),
#: then the recall preset's (``learns-*``, ``reach-*``).
PROPOSITIONS: tuple[_frozen.Proposition, ...] = _frozen.PROPOSITIONS


def frozen_hash() -> str:
    """SHA-256 of posenc/lab/propositions.py, the file that froze the chapter's claims.

    It holds every proposition, its threshold, its stated verdict and the rules.

    Returns
    -------
    The hex digest of the file's bytes (64 characters).
    """
    return _frozen.frozen_hash()


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
