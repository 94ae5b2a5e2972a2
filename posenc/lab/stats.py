"""The interval every lab statistic is reported with: a 95% t-interval over seeds."""

from __future__ import annotations

import math

__all__ = ["t_interval"]

# two-sided 95% quantiles of Student's t, degrees of freedom 1..30
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_interval(values) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the 95% t-interval for the mean of ``values`` (``lo = hi = mean``
    for one value; for more than 31 values the normal quantile 1.96 is used)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("values must be non-empty")
    n = len(values)
    mean = math.fsum(values) / n
    if n == 1:
        return mean, mean, mean
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = (_T975[n - 2] if n - 1 <= len(_T975) else 1.96) * sd / math.sqrt(n)
    return mean, mean - half, mean + half
