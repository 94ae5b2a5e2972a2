"""posenc.analysis.Claims: every method asserts, and the table shows what was measured."""

import math

import pytest

from posenc.analysis import Claims


def test_rows_and_table():
    claims = Claims().at_most("error", 3.2e-15, 1e-12, magnitude=True).at_least("kept", 0.75, 0.5)
    claims.between("ratio", 2.0, 1.5, 2.5).holds("a | b", True, "3 of 3", "all")
    table = claims._repr_markdown_().splitlines()
    assert table[2] == "| error | < 1e-14 | ≤ 1e-12 |"
    assert table[3] == "| kept | 0.75 | ≥ 0.5 |"
    assert table[5] == "| a \\| b | 3 of 3 | all |"


def test_roundoff_rows_do_not_show_machine_digits():
    import torch

    claims = Claims().roundoff("tiny", torch.tensor(3e-17), 1e-12).roundoff("near", 4e-13, 1e-12)
    assert claims.rows == [("tiny", "< 1e-14", "≤ 1e-12"), ("near", "≤ 1e-12", "≤ 1e-12")]
    with pytest.raises(AssertionError, match="over"):
        claims.roundoff("over", 2e-12, 1e-12)


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.at_most("x", 2.0, 1.0),
        lambda c: c.at_most("x", math.nan, 1.0),
        lambda c: c.at_least("x", 0.1, 0.5),
        lambda c: c.at_least("x", math.nan, 0.5),
        lambda c: c.between("x", 3.0, 1.0, 2.0),
        lambda c: c.holds("x", False),
    ],
)
def test_a_false_claim_fails_and_is_not_recorded(call):
    claims = Claims()
    with pytest.raises(AssertionError, match="x"):
        call(claims)
    assert claims.rows == []
