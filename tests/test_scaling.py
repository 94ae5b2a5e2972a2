"""Tests for posenc.scaling: each scaling against its published formula, written out here."""

import math

import pytest
import torch

import posenc
from posenc import RopeScaling


def unscaled(dim, base):
    return [base ** (-2 * i / dim) for i in range(dim // 2)]


def as_list(t):
    assert t.dtype == torch.float64
    return t.tolist()


def close(got, want, tol=1e-13):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= tol * abs(w), (g, w)


@pytest.mark.parametrize("factor", [1.0, 2.0, 8.0])
def test_linear_divides_every_frequency(factor):
    got = as_list(posenc.rope_frequencies(64, scaling=RopeScaling.linear(factor)))
    close(got, [w / factor for w in unscaled(64, 10000.0)])


@pytest.mark.parametrize("dim", [4, 64, 128])
def test_ntk_changes_the_base(dim):
    s, base = 4.0, 10000.0
    got = as_list(posenc.rope_frequencies(dim, base=base, scaling=RopeScaling.ntk(s)))
    new_base = base * s ** (dim / (dim - 2))
    close(got, unscaled(dim, new_base))
    # bloc97's design: the highest frequency is kept, the lowest is interpolated by s
    assert got[0] == 1.0
    assert abs(got[-1] - unscaled(dim, base)[-1] / s) < 1e-12 * got[-1]


def test_dynamic_ntk_grows_with_length():
    s, orig, dim, base = 4.0, 2048, 64, 10000.0
    scaling = RopeScaling.dynamic_ntk(s, orig)
    for seq_len in (None, 10, orig):  # within the training length: nothing changes
        close(
            as_list(posenc.rope_frequencies(dim, scaling=scaling, seq_len=seq_len)),
            unscaled(dim, base),
        )
    for seq_len in (4096, 3 * orig, 100_000):
        new_base = base * (s * seq_len / orig - (s - 1)) ** (dim / (dim - 2))
        got = as_list(posenc.rope_frequencies(dim, scaling=scaling, seq_len=seq_len))
        close(got, unscaled(dim, new_base))
    # at seq_len = orig * (s + 1) / s the effective factor is 2: static NTK with factor 2
    close(
        as_list(posenc.rope_frequencies(dim, scaling=scaling, seq_len=orig * 5 // 4)),
        as_list(posenc.rope_frequencies(dim, scaling=RopeScaling.ntk(2.0))),
    )


@pytest.mark.parametrize("dim,base,s,orig", [(128, 10000.0, 4.0, 4096), (64, 500000.0, 16.0, 8192)])
def test_yarn_against_reference_formula(dim, base, s, orig):
    beta_fast, beta_slow = 32.0, 1.0
    got = as_list(posenc.rope_frequencies(dim, base=base, scaling=RopeScaling.yarn(s, orig)))

    # index at which a frequency makes `turns` full turns over the original context
    def index(turns):
        return dim * math.log(orig / (turns * 2 * math.pi)) / (2 * math.log(base))

    lo = max(math.floor(index(beta_fast)), 0)
    hi = min(math.ceil(index(beta_slow)), dim - 1)
    want = []
    for i, w in enumerate(unscaled(dim, base)):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0: extrapolate (keep), 1: interpolate
        want.append((1 - ramp) * w + ramp * w / s)
    close(got, want)
    # the paper's facts, by turns r_i = orig * omega_i / (2 pi) over the original context
    for g, w in zip(got, unscaled(dim, base), strict=True):
        turns = orig * w / (2 * math.pi)
        if turns >= beta_fast:
            assert g == w
        if turns <= beta_slow:
            assert abs(g - w / s) <= 1e-15 * w
    assert RopeScaling.yarn(s, orig).attention_factor == pytest.approx(
        0.1 * math.log(s) + 1, abs=1e-15
    )


def test_llama3_bands():
    # Llama 3.1's published setting
    dim, base, s, orig, low, high = 128, 500000.0, 8.0, 8192, 1.0, 4.0
    got = as_list(posenc.rope_frequencies(dim, base=base, scaling=RopeScaling.llama3(s, orig)))
    kept = scaled = blended = 0
    for g, w in zip(got, unscaled(dim, base), strict=True):
        wavelength = 2 * math.pi / w
        if wavelength < orig / high:
            assert g == w
            kept += 1
        elif wavelength > orig / low:
            assert abs(g - w / s) <= 1e-15 * w
            scaled += 1
        else:
            a = (orig / wavelength - low) / (high - low)
            assert abs(g - ((1 - a) * w / s + a * w)) <= 1e-14 * w
            assert w / s <= g <= w
            blended += 1
    assert kept and scaled and blended  # all three bands are exercised


def test_attention_factor_is_one_except_yarn():
    for scaling in (
        RopeScaling.linear(4),
        RopeScaling.ntk(4),
        RopeScaling.dynamic_ntk(4, 100),
        RopeScaling.llama3(4, 100),
    ):
        assert scaling.attention_factor == 1.0
    assert RopeScaling.yarn(1.0, 100).attention_factor == 1.0


def test_factor_one_is_identity():
    base = unscaled(32, 10000.0)
    for scaling in (
        RopeScaling.linear(1),
        RopeScaling.ntk(1),
        RopeScaling.yarn(1, 128),
        RopeScaling.llama3(1, 128),
    ):
        close(as_list(posenc.rope_frequencies(32, scaling=scaling)), base)


def test_bad_arguments():
    with pytest.raises(ValueError, match="factor"):
        RopeScaling.linear(0.5)
    with pytest.raises(TypeError, match="factor"):
        RopeScaling.ntk("2")
    with pytest.raises(ValueError, match="factor"):
        RopeScaling.yarn(float("nan"), 100)
    with pytest.raises(ValueError, match="original_max_positions"):
        RopeScaling.dynamic_ntk(2, 0)
    with pytest.raises(TypeError, match="original_max_positions"):
        RopeScaling.llama3(2, 81.5)
    with pytest.raises(ValueError, match="beta_fast"):
        RopeScaling.yarn(2, 100, beta_fast=1.0, beta_slow=2.0)
    with pytest.raises(ValueError, match="beta_slow"):
        RopeScaling.yarn(2, 100, beta_slow=-1.0)
    with pytest.raises(ValueError, match="high_freq_factor"):
        RopeScaling.llama3(2, 100, low_freq_factor=4.0, high_freq_factor=1.0)
    with pytest.raises(ValueError, match="dim"):
        RopeScaling.ntk(2).frequencies(2)
    with pytest.raises(ValueError, match="dim"):
        RopeScaling.linear(2).frequencies(7)
    with pytest.raises(ValueError, match="kind"):
        RopeScaling("xpos", 2.0)
