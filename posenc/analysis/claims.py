"""A chapter's checked claims, asserted one by one and shown as one table.

A run of bare ``True`` outputs tells a reader nothing; a table of *claim, measured
value, bound* does, and the asserts stay.  Each method asserts at once, so a
failing claim stops the notebook with its numbers::

    claims = Claims()
    claims.at_most("fp32 table error up to 10**6", err, 2.5e-7)
    claims.at_least("weight kept by the nearest key", w0, 0.5)
    claims.roundoff("RoPE scores depend on m - n only", diff, 1e-12)
    claims.holds("the two sets agree", found == expected, f"{len(found)} schemes")
    claims.equal("graphs compiled at each length", graphs, [1] + [0] * 19)
    claims.shows("uniform guess over the visible keys", 1 / 32)
    claims  # displayed as a Markdown table (render it with markdown_format: myst)

Stored outputs are compared on other machines, thread counts and instruction sets,
so nothing in the table may depend on them:

- the measured value is printed with ``fmt``: pick a format well above its noise;
- a roundoff-level value is never printed, neither its digits nor the decade it
  happened to land in: a :meth:`Claims.roundoff` row reads ``roundoff`` under
  "measured" and the bound it was checked against (``≤ 1e-12``) under "bound", so no
  row shows a bound as if it had been measured;
- a value that is not one number (a list of counts, a set of names) is checked with
  :meth:`Claims.equal`, which prints what was measured, shortened the same way as the
  expected value, rather than a string typed beside the check;
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


def _brief(value: object, *, keep: int = 5) -> str:
    """``value`` as a table cell: a list or tuple of more than ``keep`` items as its first
    two, ``...`` and its last (``[1, 0, ..., 0]``), a 0-d tensor or array as its item,
    anything else as ``str(value)``.

    >>> _brief([1] + [0] * 19), _brief((3, 4)), _brief(7)
    ('[1, 0, ..., 0]', '(3, 4)', '7')
    """
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # a 0-d tensor or array
        value = value.item()
    if isinstance(value, (list, tuple)) and len(value) > keep:
        inner = f"{value[0]!s}, {value[1]!s}, ..., {value[-1]!s}"
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return str(value)


def _number(claim: str, value: SupportsFloat | str | bytes, name: str) -> float:
    """``value`` as a float: a number, or a one-element tensor or array (a string is refused)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{claim}: {name} must be a measured number, got {type(value).__name__}")
    if hasattr(value, "detach"):
        value = value.detach()
    return float(value)


def _is_float(x: object) -> bool:
    """True for a float, a NumPy floating scalar or a floating tensor or array."""
    dtype = getattr(x, "dtype", None)
    return (
        isinstance(x, float)
        or bool(getattr(dtype, "is_floating_point", False))
        or getattr(dtype, "kind", "") in ("f", "c")
    )


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
    A row's "measured" cell is always computed from the data, or a word that says why it
    is not a number: ``roundoff`` (:meth:`roundoff`); a row that is only displayed reads
    ``shown`` under "bound" (:meth:`shows`).

    Examples
    --------
    >>> claims = Claims().at_most("error of the table", 2.1e-7, 2.5e-7)
    >>> claims.roundoff("scores depend on m - n only", 3e-16, 1e-12).rows[-1]
    ('scores depend on m - n only', 'roundoff', '≤ 1e-12')
    >>> claims.equal("graphs compiled at each length", [1] + [0] * 19, [1] + [0] * 19).rows[-1]
    ('graphs compiled at each length', '[1, 0, ..., 0]', '= [1, 0, ..., 0]')
    >>> print(claims.shows("uniform guess", 1 / 32).markdown())
    | claim | measured | bound |
    | --- | ---: | ---: |
    | error of the table | 2.1e-07 | ≤ 2.5e-07 |
    | scores depend on m - n only | roundoff | ≤ 1e-12 |
    | graphs compiled at each length | [1, 0, ..., 0] | = [1, 0, ..., 0] |
    | uniform guess | 0.0312 | shown |
    >>> claims
    Claims(3 checked, 1 shown)
    """

    #: What the "measured" cell of a :meth:`roundoff` row reads, in place of a number.
    ROUNDOFF = "roundoff"

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []
        self.checked = 0
        self.shown = 0

    def _check(self, claim: str, measured: str, bound: str) -> Claims:
        self.rows.append((claim, measured, bound))
        self.checked += 1
        return self

    def roundoff(self, claim: str, error: SupportsFloat, bound: float) -> Claims:
        """Assert a roundoff-level ``error <= bound``; the row reads ``roundoff | ≤ bound``.

        A roundoff error's digits, and even its power of ten, change with the CPU, the
        instruction set and the thread count, so the stored output does not print it:
        its "measured" cell names what was measured (``roundoff``, ``Claims.ROUNDOFF``)
        and its "bound" cell the bound it was checked against, the same wherever the
        chapter is re-run.  Choose the bound well above the roundoff of every machine
        (a NaN fails).
        """
        error = _number(claim, error, "error")
        assert error <= bound, f"{claim}: measured {error!r}, bound <= {bound!r}"
        return self._check(claim, self.ROUNDOFF, f"≤ {_exp(bound)}")

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

    def holds(
        self, claim: str, ok: object, measured: object = "yes", bound: object = "—"
    ) -> Claims:
        """Assert a claim that is not one number.

        ``ok`` must be the result of a comparison on what was measured: a bool, or a
        one-element bool tensor or array; anything else (a string, a number, a tensor of
        several elements) raises ``TypeError``.  A constant such as ``True`` is not a
        check: show the value with :meth:`shows` instead.  ``measured`` is printed as
        given, a list or tuple of more than five items shortened to ``[a, b, ..., z]``:
        pass what was measured (the list of counts, not a string that restates the
        bound).  Where the claim is an equality, :meth:`equal` does both at once.
        """
        assert _truth(claim, ok), f"{claim}: does not hold (measured {measured})"
        return self._check(claim, _brief(measured), _brief(bound))

    def equal(self, claim: str, value: object, expected: object) -> Claims:
        """Assert ``value == expected`` for a value that is not one float: a count, a list, a name.

        The row prints ``value`` itself under "measured" and ``= expected`` under
        "bound", both shortened alike (``[1, 0, ..., 0]`` for a list longer
        than five), so the table shows what was measured rather than a string typed
        beside the check.  The comparison must give one bool: compare tensors and
        arrays after ``.tolist()``.  A float is checked with :meth:`between` or
        :meth:`roundoff` instead, with a tolerance.
        """
        if _is_float(value) or _is_float(expected):
            raise TypeError(f"{claim}: a float needs a tolerance: use between or roundoff")
        if any(getattr(x, "ndim", 0) for x in (value, expected)):  # == is elementwise or odd
            raise TypeError(
                f"{claim}: value == expected must give one bool: compare a tensor or an "
                "array of several elements after .tolist()"
            )
        same = _truth(claim, value == expected)
        assert same, f"{claim}: measured {value!r}, expected {expected!r}"
        return self._check(claim, _brief(value), f"= {_brief(expected)}")

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
