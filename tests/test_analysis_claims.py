"""posenc.analysis.Claims: every check asserts, a displayed value is not counted as one, no
row shows digits that depend on the machine, and no row prints a bound under "measured"."""

import math

import numpy as np
import pytest
import torch

from posenc.analysis import Claims


def test_rows_and_table():
    claims = Claims().at_most("error", 3.2e-15, 1e-12, fmt=".0e").at_least("kept", 0.75, 0.5)
    claims.between("ratio", 2.0, 1.5, 2.5).holds("a | b", True, "3 of 3", "all")
    table = claims._repr_markdown_().splitlines()
    assert table[:2] == ["| claim | measured | bound |", "| --- | ---: | ---: |"]
    assert table[2] == "| error | 3e-15 | ≤ 1e-12 |"
    assert table[3] == "| kept | 0.75 | ≥ 0.5 |"
    assert table[4] == "| ratio | 2 | [1.5, 2.5] |"
    assert table[5] == "| a \\| b | 3 of 3 | all |"
    assert repr(claims) == "Claims(4 checked)"


@pytest.mark.parametrize("error", [0.0, 3e-17, 9.9e-15, 1e-14, 4e-13, 1e-12, torch.tensor(3e-17)])
def test_a_roundoff_row_reads_the_same_wherever_the_error_lands(error):
    # One machine lands at 9.9e-15, another at 1e-14: the row must read the same.
    assert Claims().roundoff("err", error, 1e-12).rows == [("err", "roundoff", "≤ 1e-12")]


def test_a_roundoff_row_does_not_print_its_bound_as_measured():
    # The "measured" column of a roundoff row used to repeat the bound (review C4).
    claims = Claims().roundoff("a", 1e-15, 1e-12).roundoff("b", 0.0, 1e-5)
    claims.at_most("c", 1e-9, 1e-6, magnitude=True)
    assert [(m, b) for _, m, b in claims.rows] == [
        ("roundoff", "≤ 1e-12"),
        ("roundoff", "≤ 1e-5"),
        ("roundoff", "≤ 1e-6"),
    ]
    assert all(not m.startswith(("≤", "<")) for _, m, _ in claims.rows)
    assert claims.markdown().splitlines()[2] == "| a | roundoff | ≤ 1e-12 |"
    assert Claims.ROUNDOFF == "roundoff"


def test_magnitude_is_the_old_spelling_of_roundoff():
    # Kept so that a chapter not yet moved still runs; it no longer prints a decade.
    for value in (9.9e-15, 1.1e-14):
        claims = Claims().at_most("err", value, 1e-4, magnitude=True)
        assert claims.rows == [("err", "roundoff", "≤ 1e-4")]
    with pytest.raises(AssertionError, match="err"):
        Claims().at_most("err", 2e-4, 1e-4, magnitude=True)


def test_roundoff_has_no_floor_any_more():
    # The floor made the row flip between '< floor' and '≤ bound' near it.
    with pytest.raises(TypeError):
        Claims().roundoff("err", 1e-15, 1e-12, floor=1e-14)


def test_shown_rows_are_not_counted_as_checks():
    claims = Claims().at_most("x", 0.1, 1.0).shows("uniform guess", 1 / 32, fmt=".3f")
    claims.shows("label", "B(250) = 1.2").shows("count", torch.tensor(7), fmt="d")
    assert claims.rows[1:] == [
        ("uniform guess", "0.031", "shown"),
        ("label", "B(250) = 1.2", "shown"),
        ("count", "7", "shown"),
    ]
    assert (claims.checked, claims.shown) == (1, 3)
    assert repr(claims) == "Claims(1 checked, 3 shown)"


@pytest.mark.parametrize(
    "ok", [True, np.bool_(True), torch.tensor(True), torch.tensor([True]), np.array([True])]
)
def test_holds_takes_the_result_of_a_comparison(ok):
    assert Claims().holds("x", ok).checked == 1


@pytest.mark.parametrize("ok", ["yes", "no", 1, 0.5, None, [True], torch.tensor([True, True])])
def test_holds_refuses_what_is_not_a_comparison(ok):
    # A string or a number is truthy whatever was measured: it would pass as a check.
    claims = Claims()
    with pytest.raises(TypeError, match="x: ok must be the bool result of a comparison"):
        claims.holds("x", ok)
    assert claims.rows == []


def test_equal_prints_what_was_measured():
    graphs = [1] + [0] * 19
    claims = Claims().equal("graphs", graphs, [1] + [0] * 19).equal("count", 5, 5)
    claims.equal("names", ("a", "b"), ("a", "b")).equal("tensor", torch.tensor(3), 3)
    claims.equal("each", [0] * 12, [0] * 12)
    assert claims.rows == [
        ("graphs", "[1, 0, ..., 0]", "= [1, 0, ..., 0]"),
        ("count", "5", "= 5"),
        ("names", "('a', 'b')", "= ('a', 'b')"),
        ("tensor", "3", "= 3"),
        ("each", "[0, 0, ..., 0]", "= [0, 0, ..., 0]"),
    ]
    assert claims.checked == 5


def test_equal_prints_the_value_not_the_expectation():
    # Five items are printed in full, so a value and its expectation differ where they do.
    claims = Claims().equal("decode", [1, 0, 0, 0, 0], [1, 0, 0, 0, 0])
    assert claims.rows == [("decode", "[1, 0, 0, 0, 0]", "= [1, 0, 0, 0, 0]")]
    with pytest.raises(AssertionError, match=r"decode: measured \[1, 0, 1, 0, 0\]"):
        Claims().equal("decode", [1, 0, 1, 0, 0], [1, 0, 0, 0, 0])
    with pytest.raises(AssertionError, match="graphs"):  # a difference hidden by "..." fails
        Claims().equal("graphs", [1, 0, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0])


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.1 + 0.2, 0.3), (np.float64(1.0), 1), (torch.tensor(1.0), 1.0), (1, 1.0)],
)
def test_equal_refuses_a_float(value, expected):
    with pytest.raises(TypeError, match="x: a float needs a tolerance"):
        Claims().equal("x", value, expected)


@pytest.mark.parametrize(
    ("value", "expected"), [(torch.tensor([1, 0]), [1, 0]), (np.array([1, 0]), np.array([1, 0]))]
)
def test_equal_refuses_an_elementwise_comparison(value, expected):
    with pytest.raises(TypeError, match=r"x: value == expected must give one bool"):
        Claims().equal("x", value, expected)


def test_holds_shortens_a_measured_list():
    counts = [1] + [0] * 11
    claims = Claims().holds("x", counts[0] == 1 and not any(counts[1:]), counts)
    assert claims.rows == [("x", "[1, 0, ..., 0]", "—")]
    assert Claims().holds("y", True, "3 of 3", "all").rows == [("y", "3 of 3", "all")]


@pytest.mark.parametrize("method", ["at_most", "at_least", "roundoff"])
def test_a_number_check_refuses_a_string(method):
    with pytest.raises(TypeError, match="x: .* must be a measured number, got str"):
        getattr(Claims(), method)("x", "1e-13", 1.0)


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.at_most("x", 2.0, 1.0),
        lambda c: c.at_most("x", math.nan, 1.0),
        lambda c: c.at_least("x", 0.1, 0.5),
        lambda c: c.at_least("x", math.nan, 0.5),
        lambda c: c.between("x", 3.0, 1.0, 2.0),
        lambda c: c.between("x", math.nan, 1.0, 2.0),
        lambda c: c.roundoff("x", 2e-12, 1e-12),
        lambda c: c.roundoff("x", math.nan, 1e-12),
        lambda c: c.holds("x", False),
        lambda c: c.holds("x", torch.tensor(False)),
        lambda c: c.equal("x", [1, 0], [1, 1]),
        lambda c: c.equal("x", 3, 4),
    ],
)
def test_a_false_claim_fails_and_is_not_recorded(call):
    claims = Claims()
    with pytest.raises(AssertionError, match="x"):
        call(claims)
    assert claims.rows == [] and claims.checked == 0
