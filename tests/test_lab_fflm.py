"""The flip-flop language (posenc.lab.fflm): its grammar, checked by a plain loop.

Golden rule, from Liu et al. (2023): a sequence starts with a write, ends with a
read, and every read's bit is the bit of the latest write; instructions between the
first and the last are i with probability p_i, w and r with (1 - p_i)/2 each.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from posenc.lab.fflm import FFLM_TOKENS, FlipFlopTask, flip_flop

IDS = {v: k for k, v in FFLM_TOKENS.items()}


def _grammar_errors(tokens: torch.Tensor, reads: torch.Tensor) -> list[str]:
    """Every violation of the grammar in one sequence, by a loop over its pairs."""
    text = [IDS[t] for t in tokens.tolist()]
    errors, memory = [], None
    if text[0] != "w" or text[-2] != "r":
        errors.append(f"starts with {text[0]}, ends with {text[-2]}")
    for pos in range(0, len(text), 2):
        op, bit = text[pos], text[pos + 1]
        if op not in "wri" or bit not in "01":
            errors.append(f"pair {pos}: {op}{bit}")
        if op == "w":
            memory = bit
        if op == "r" and bit != memory:
            errors.append(f"read at {pos} gives {bit}, memory holds {memory}")
        if bool(reads[pos + 1]) != (op == "r") or bool(reads[pos]):
            errors.append(f"read flag wrong at {pos}")
    return errors


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    pairs=st.integers(2, 200),
    p_ignore=st.sampled_from([0.0, 0.1, 0.5, 0.8, 0.98]),
)
def test_every_read_returns_the_last_write(seed: int, pairs: int, p_ignore: float) -> None:
    tokens, reads = flip_flop(3, 2 * pairs, p_ignore, torch.Generator().manual_seed(seed))
    assert tokens.dtype == torch.int64 and reads.dtype == torch.bool
    for row in range(3):
        assert _grammar_errors(tokens[row], reads[row]) == []


@pytest.mark.parametrize("p_ignore", [0.1, 0.8, 0.98])
def test_instruction_proportions_match_p_ignore(p_ignore: float) -> None:
    # the middle instructions (not the fixed first w and last r): each count within its
    # 99.9% Clopper-Pearson interval, and reads balance writes
    tokens, _ = flip_flop(64, 2 * 512, p_ignore, torch.Generator().manual_seed(7))
    ops = tokens[:, 2:-2:2].flatten()
    n = ops.numel()
    for op, p in (("i", p_ignore), ("w", (1 - p_ignore) / 2), ("r", (1 - p_ignore) / 2)):
        k = int((ops == FFLM_TOKENS[op]).sum())
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.999, method="exact")
        assert ci.low <= p <= ci.high, (op, k, n, p, ci)


def test_written_and_ignored_bits_are_fair() -> None:
    tokens, reads = flip_flop(64, 1024, 0.8, torch.Generator().manual_seed(3))
    free = tokens[:, 1::2][~reads[:, 1::2]]
    k, n = int((free == FFLM_TOKENS["1"]).sum()), free.numel()
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.999, method="exact")
    assert ci.low <= 0.5 <= ci.high


def test_the_generator_state_fixes_the_sequences() -> None:
    a = flip_flop(2, 64, 0.8, torch.Generator().manual_seed(5))
    b = flip_flop(2, 64, 0.8, torch.Generator().manual_seed(5))
    c = flip_flop(2, 64, 0.8, torch.Generator().manual_seed(6))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])


def test_task_scores_only_the_bits_after_reads() -> None:
    task = FlipFlopTask(0.8)
    x, y, w = task.batch(4, 255, torch.Generator().manual_seed(1))
    assert x.shape == y.shape == w.shape == (4, 255)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens
    scored = w.bool()
    # a scored target is a bit whose input is the r before it, and every such one is scored
    assert bool((x[scored] == FFLM_TOKENS["r"]).all())
    assert torch.equal(scored, x == FFLM_TOKENS["r"])
    assert bool((y[scored] >= FFLM_TOKENS["0"]).all())


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: flip_flop(1, 7, 0.8, torch.Generator()), "length must be even"),
        (lambda: flip_flop(1, 2, 0.8, torch.Generator()), "length"),
        (lambda: flip_flop(0, 8, 0.8, torch.Generator()), "batch"),
        (lambda: flip_flop(1, 8, 1.0, torch.Generator()), "p_ignore"),
        (lambda: flip_flop(1, 8, -0.1, torch.Generator()), "p_ignore"),
        (lambda: FlipFlopTask(1.2), "p_ignore"),
        (lambda: FlipFlopTask(0.8).batch(1, 256, torch.Generator()), "length must be odd"),
    ],
)
def test_bad_input_is_named(call, name: str) -> None:
    with pytest.raises((ValueError, TypeError), match=name):
        call()
