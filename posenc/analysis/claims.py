"""A chapter's checked claims, asserted one by one and shown as one table.

A run of bare ``True`` outputs tells a reader nothing; a table of *claim, measured
value, bound* does, and the asserts stay.  Each method asserts at once, so a
failing claim stops the notebook with its numbers::

    claims = Claims()
    claims.at_most("fp32 table error up to 10**6", err, 2.5e-7)
    claims.at_least("weight kept by the nearest key", w0, 0.5)
    claims.holds("RoPE scores depend on m - n only", diff < 1e-12, f"{diff:.0e}")
    claims  # displayed as a Markdown table (render it with markdown_format: myst)

The measured value is printed with ``fmt``.  Pick a format well above the value's
noise (roundoff, thread count, CPU): stored outputs are compared on other machines.
``magnitude=True`` prints an error as the power of ten above it (``< 1e-12``).
"""

from __future__ import annotations

import math

__all__ = ["Claims"]


def _power_above(value: float) -> str:
    if value <= 0:
        return "0"
    return f"< 1e{math.floor(math.log10(value)) + 1}"


def _exp(x: float) -> str:
    """``1e-05`` as ``1e-5``: one significant digit, no padded exponent."""
    return format(x, ".0e").replace("e-0", "e-").replace("e+0", "e+")


class Claims:
    """Assert claims one at a time and show them as a ``claim | measured | bound`` table."""

    def __init__(self):
        self.rows: list[tuple[str, str, str]] = []

    def roundoff(self, claim: str, error, bound: float, *, floor: float | None = None):
        """Assert a roundoff-level ``error <= bound``; show it without its machine-dependent digits.

        The digits of a roundoff error change with the CPU and the thread count, so the
        table shows ``< floor`` (default ``bound / 100``) when the error is below it, and
        ``≤ bound`` otherwise: the stored output is the same wherever it is re-run.
        """
        error = float(error.detach()) if hasattr(error, "detach") else float(error)
        floor = bound / 100 if floor is None else floor
        assert error <= bound, f"{claim}: measured {error!r}, bound <= {bound!r}"
        shown = f"< {_exp(floor)}" if error < floor else f"≤ {_exp(bound)}"
        self.rows.append((claim, shown, f"≤ {_exp(bound)}"))
        return self

    def _show(self, value, fmt: str, magnitude: bool) -> str:
        return _power_above(float(value)) if magnitude else format(float(value), fmt)

    def at_most(self, claim: str, value, bound: float, *, fmt: str = ".3g", magnitude=False):
        """Assert ``value <= bound`` (a NaN fails) and record the row."""
        value = float(value)
        assert value <= bound, f"{claim}: measured {value!r}, bound <= {bound!r}"
        self.rows.append((claim, self._show(value, fmt, magnitude), f"≤ {bound:{fmt}}"))
        return self

    def at_least(self, claim: str, value, bound: float, *, fmt: str = ".3g", magnitude=False):
        """Assert ``value >= bound`` (a NaN fails) and record the row."""
        value = float(value)
        assert value >= bound, f"{claim}: measured {value!r}, bound >= {bound!r}"
        self.rows.append((claim, self._show(value, fmt, magnitude), f"≥ {bound:{fmt}}"))
        return self

    def between(self, claim: str, value, low: float, high: float, *, fmt: str = ".3g"):
        """Assert ``low <= value <= high`` and record the row."""
        value = float(value)
        assert low <= value <= high, f"{claim}: measured {value!r}, bounds [{low!r}, {high!r}]"
        self.rows.append((claim, format(value, fmt), f"[{low:{fmt}}, {high:{fmt}}]"))
        return self

    def holds(self, claim: str, ok: bool, measured: str = "yes", bound: str = "—"):
        """Assert a claim that is not one number (``ok`` must be a true bool)."""
        assert bool(ok), f"{claim}: does not hold (measured {measured})"
        self.rows.append((claim, measured, bound))
        return self

    def markdown(self) -> str:
        """The table in Markdown; ``|`` inside a cell is escaped."""

        def cell(text: str) -> str:
            return str(text).replace("|", "\\|")

        lines = ["| claim | measured | bound |", "| --- | ---: | ---: |"]
        lines += [f"| {cell(c)} | {cell(m)} | {cell(b)} |" for c, m, b in self.rows]
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def __repr__(self) -> str:
        return f"Claims({len(self.rows)} checked)"
