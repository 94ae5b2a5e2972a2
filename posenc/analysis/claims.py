"""A chapter's checked claims, asserted one by one and shown as one table.

A run of bare ``True`` outputs tells a reader nothing; a table of *claim, measured
value, bound* does, and the asserts stay.  Each method asserts at once, so a
failing claim stops the notebook with its numbers::

    claims = Claims()
    claims.at_most("fp32 table error up to 10**6", err, 2.5e-7)
    claims.at_least("weight kept by the nearest key", w0, 0.5)
    claims.roundoff("RoPE scores depend on m - n only", diff, 1e-12)
    claims.holds("the two sets agree", found == expected, f"{len(found)} schemes")
    claims.shows("uniform guess over the visible keys", 1 / 32)
    claims  # displayed as a Markdown table (render it with markdown_format: myst)

Stored outputs are compared on other machines, thread counts and instruction sets,
so nothing in the table may depend on them:

- the measured value is printed with ``fmt``: pick a format well above its noise;
- a roundoff-level value is shown as the bound it was checked against
  (:meth:`Claims.roundoff` prints ``≤ 1e-12``), never as the digits or the decade it
  happened to land in;
- a value that is only displayed, not checked, goes through :meth:`Claims.shows`: its
  row reads "shown" and it is not counted as a check.  A check's condition must be
  computed from what was measured; ``holds(claim, True)`` is not a check
  (``tests/test_chapter_claims.py`` rejects a constant condition in any chapter).
"""

from __future__ import annotations

import numbers
from typing import SupportsFloat

__all__ = ["Claims"]


def _exp(x: float) -> str:
    """``1e-05`` as ``1e-5``: one significant digit, no padded exponent."""
    return format(x, ".0e").replace("e-0", "e-").replace("e+0", "e+")


def _number(claim: str, value: SupportsFloat | str | bytes, name: str) -> float:
    """``value`` as a float: a number, or a one-element tensor or array (a string is refused)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{claim}: {name} must be a measured number, got {type(value).__name__}")
    if hasattr(value, "detach"):
        value = value.detach()
    return float(value)


def _truth(claim: str, ok: object) -> bool:
    """``ok`` as a bool, accepted only from a comparison: a bool, or a one-element bool array."""
    if isinstance(ok, bool):
        return ok
    if str(getattr(ok, "dtype", "")) in ("bool", "torch.bool"):
        count = ok.numel() if hasattr(ok, "numel") else getattr(ok, "size", None)
        if count == 1:
            return bool(ok)
    raise TypeError(
        f"{claim}: ok must be the bool result of a comparison, got {type(ok).__name__} "
        "(a value that is only displayed goes through Claims.shows)"
    )


class Claims:
    """Assert claims one at a time and show them as a ``claim | measured | bound`` table.

    ``rows`` holds one ``(claim, measured, bound)`` tuple of strings per row, in order;
    ``checked`` and ``shown`` count the rows that were asserted and those only displayed.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []
        self.checked = 0
        self.shown = 0

    def _check(self, claim: str, measured: str, bound: str) -> Claims:
        self.rows.append((claim, measured, bound))
        self.checked += 1
        return self

    def roundoff(self, claim: str, error: SupportsFloat, bound: float) -> Claims:
        """Assert a roundoff-level ``error <= bound``; the row shows ``≤ bound`` in both columns.

        A roundoff error's digits, and even its power of ten, change with the CPU, the
        instruction set and the thread count, so the stored output shows only the bound
        it was checked against: the same wherever the chapter is re-run.  Choose the
        bound well above the roundoff of every machine (a NaN fails).
        """
        error = _number(claim, error, "error")
        assert error <= bound, f"{claim}: measured {error!r}, bound <= {bound!r}"
        return self._check(claim, f"≤ {_exp(bound)}", f"≤ {_exp(bound)}")

    def at_most(
        self,
        claim: str,
        value: SupportsFloat,
        bound: float,
        *,
        fmt: str = ".3g",
        magnitude: bool = False,
    ) -> Claims:
        """Assert ``value <= bound`` (a NaN fails); the row prints the value with ``fmt``.

        ``magnitude=True`` is the old spelling of :meth:`roundoff`: the row shows the
        bound, not the value.  It is kept so that chapters not yet moved still run;
        write ``roundoff(claim, value, bound)`` instead.
        """
        if magnitude:
            return self.roundoff(claim, value, bound)
        value = _number(claim, value, "value")
        assert value <= bound, f"{claim}: measured {value!r}, bound <= {bound!r}"
        return self._check(claim, format(value, fmt), f"≤ {bound:{fmt}}")

    def at_least(
        self, claim: str, value: SupportsFloat, bound: float, *, fmt: str = ".3g"
    ) -> Claims:
        """Assert ``value >= bound`` (a NaN fails); the row prints the value with ``fmt``."""
        value = _number(claim, value, "value")
        assert value >= bound, f"{claim}: measured {value!r}, bound >= {bound!r}"
        return self._check(claim, format(value, fmt), f"≥ {bound:{fmt}}")

    def between(
        self, claim: str, value: SupportsFloat, low: float, high: float, *, fmt: str = ".3g"
    ) -> Claims:
        """Assert ``low <= value <= high`` (a NaN fails) and record the row."""
        value = _number(claim, value, "value")
        assert low <= value <= high, f"{claim}: measured {value!r}, bounds [{low!r}, {high!r}]"
        return self._check(claim, format(value, fmt), f"[{low:{fmt}}, {high:{fmt}}]")

    def holds(self, claim: str, ok: object, measured: str = "yes", bound: str = "—") -> Claims:
        """Assert a claim that is not one number.

        ``ok`` must be the result of a comparison on what was measured: a bool, or a
        one-element bool tensor or array; anything else (a string, a number, a tensor of
        several elements) raises ``TypeError``.  A constant such as ``True`` is not a
        check: show the value with :meth:`shows` instead.
        """
        assert _truth(claim, ok), f"{claim}: does not hold (measured {measured})"
        return self._check(claim, str(measured), str(bound))

    def shows(self, claim: str, measured: object, *, fmt: str = ".3g") -> Claims:
        """Display a value that is not checked: its row reads "shown" and is not counted as a check.

        A number is printed with ``fmt``; anything else as its string.  Use it for what a
        reader needs beside the checks (a baseline, a value a later sentence quotes) and
        for what is not a claim; the same rules of machine independence apply.
        """
        if hasattr(measured, "item"):  # a one-element tensor or array; an integer stays one
            measured = measured.item()
        if isinstance(measured, numbers.Real) and not isinstance(measured, bool):
            measured = format(measured, fmt)
        self.rows.append((claim, str(measured), "shown"))
        self.shown += 1
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
        shown = f", {self.shown} shown" if self.shown else ""
        return f"Claims({self.checked} checked{shown})"
