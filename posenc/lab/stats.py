"""The lab's statistics: intervals and tests over seeds, and a multiplicity correction.

* :func:`t_interval`: the 95% Student-t interval for the mean of a continuous,
  unimodal statistic (a paired loss difference), one value per seed.
* :func:`t_test`: one-sided p-values of that mean against a threshold.
* :func:`clopper_pearson`: the exact binomial interval for ``k`` successes out
  of ``n`` (seeds that pass a criterion, or correct answers out of ``n``); it
  lies in [0, 1] and never has zero width.
* :func:`binomial_tail`: one-sided exact binomial p-values.
* :func:`holm`: Holm's step-down adjustment of a family of p-values.

The exact tests (:func:`clopper_pearson`, :func:`binomial_tail`) need only the
standard library up to 10,000 trials, and PyTorch above (every term at once).  The Student-t tail
(:func:`t_test`) uses SciPy, imported when called (``pip install posenc[lab]``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch

__all__ = ["binomial_tail", "clopper_pearson", "holm", "t_interval", "t_test"]

# two-sided 95% quantiles of Student's t, degrees of freedom 1..30
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def _mean_sd(values: Iterable[float]) -> tuple[int, float, float]:
    values = [float(v) for v in values]
    if not values:
        raise ValueError("values must be non-empty")
    n = len(values)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return n, mean, sd


def t_interval(
    values: Iterable[float], level: float = 0.95, exact: bool = False
) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the two-sided t-interval for the mean of ``values``.

    Parameters
    ----------
    values
        One number per seed, at least one (``ValueError`` when empty).
    level
        The confidence level, in (0, 1).
    exact
        Use SciPy's quantile at ``level`` 0.95 too.  At 0.95 the quantile
        otherwise comes from a table (3 decimals; df 1..30, the normal 1.96
        beyond); any other level uses SciPy's (``pip install posenc[lab]``).

    Returns
    -------
    The mean and the interval's ends, floats; ``lo = hi = mean`` for one value.
    """
    n, mean, sd = _mean_sd(values)
    if n == 1:
        return mean, mean, mean
    if level == 0.95 and not exact:
        q = _T975[n - 2] if n - 1 <= len(_T975) else 1.96
    else:
        if not 0 < level < 1:
            raise ValueError(f"level must lie in (0, 1), got {level}")
        from scipy import stats

        q = float(stats.t.ppf(0.5 + level / 2, n - 1))
    half = q * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def t_test(values: Sequence[float], threshold: float = 0.0) -> tuple[float, float]:
    """One-sided p-values ``(p_above, p_below)`` of the one-sample t-test of the mean
    of ``values`` against ``threshold``: ``p_above`` tests "mean > threshold"
    (null: mean <= threshold), ``p_below`` tests "mean < threshold".

    Needs at least 2 values and a non-zero spread (``ValueError`` otherwise:
    no test exists then).
    """
    n, mean, sd = _mean_sd(values)
    if n < 2 or sd == 0:
        raise ValueError(f"values must hold at least 2 values that differ, got {list(values)}")
    from scipy import stats

    t = (mean - threshold) / (sd / math.sqrt(n))
    return float(stats.t.sf(t, n - 1)), float(stats.t.cdf(t, n - 1))


def _log_pmf(k: int, n: int, p: float) -> float:
    if p <= 0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1:
        return 0.0 if k == n else -math.inf
    return (
        math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        + k * math.log(p) + (n - k) * math.log1p(-p)
    )  # fmt: skip


# Up to this many trials the tails are summed term by term with math.fsum (the values the
# stored chapters print); above it, as one float64 logsumexp (equal to SciPy to 1e-9).
_EXACT_SUM_UP_TO = 10_000


def binomial_tail(k: int, n: int, p: float) -> tuple[float, float]:
    """Exact one-sided binomial p-values ``(P(X >= k), P(X <= k))`` for ``X ~ Bin(n, p)``."""
    k, n = int(k), int(n)
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"k must lie in 0..n with n >= 1, got k={k}, n={n}")
    if not 0 <= p <= 1:
        raise ValueError(f"p must lie in [0, 1], got {p}")
    if n <= _EXACT_SUM_UP_TO:  # an exactly rounded sum, term by term
        terms = [math.exp(_log_pmf(i, n, p)) for i in range(n + 1)]
        return min(1.0, math.fsum(terms[k:])), min(1.0, math.fsum(terms[: k + 1]))
    if p <= 0:  # X = 0
        return (1.0 if k == 0 else 0.0), 1.0
    if p >= 1:  # X = n
        return 1.0, (1.0 if k == n else 0.0)
    # every term's log at once, in float64: for the reads of a whole run (up to ~10^5)
    # the loop above, 120 times per interval, took seconds
    i = torch.arange(n + 1, dtype=torch.float64)
    log_terms = (
        math.lgamma(n + 1) - torch.lgamma(i + 1) - torch.lgamma(n - i + 1)
        + i * math.log(p) + (n - i) * math.log1p(-p)
    )  # fmt: skip
    above = torch.logsumexp(log_terms[k:], 0).exp().item()
    below = torch.logsumexp(log_terms[: k + 1], 0).exp().item()
    return min(1.0, above), min(1.0, below)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval ``(lo, hi)`` for a binomial
    proportion, ``k`` successes out of ``n``.

    ``lo`` is the ``p`` with ``P(X >= k) = (1 - level) / 2`` (0 when ``k = 0``),
    ``hi`` the ``p`` with ``P(X <= k) = (1 - level) / 2`` (1 when ``k = n``),
    found by bisection to 1e-12.  The interval always lies in [0, 1] and, for
    ``n >= 1``, has positive width.
    """
    k, n = int(k), int(n)
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"k must lie in 0..n with n >= 1, got k={k}, n={n}")
    alpha = (1 - level) / 2

    def solve(tail: Callable[[float], float], increasing: bool) -> float:
        a, b = 0.0, 1.0
        for _ in range(60):
            m = (a + b) / 2
            if (tail(m) < alpha) == increasing:
                a = m
            else:
                b = m
        return (a + b) / 2

    lo = 0.0 if k == 0 else solve(lambda p: binomial_tail(k, n, p)[0], True)
    hi = 1.0 if k == n else solve(lambda p: binomial_tail(k, n, p)[1], False)
    return lo, hi


def holm(pvalues: Iterable[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given.

    Sorted ascending, ``p_(i)`` becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``
    for a family of ``m``; a verdict survives at level ``alpha`` when its
    adjusted p-value is below ``alpha``.  This controls the chance of any
    false verdict in the family at ``alpha``, for any dependence between the
    tests.
    """
    ps = [float(p) for p in pvalues]
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out
