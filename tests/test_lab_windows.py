"""The windows the lab scores have the law of fresh samples (issue 19, item 3).

The lab's source is not stationary: its first ``max(offsets)`` tokens are
never copies, so P(x1 = x0) is 1/active for a fresh sequence and much higher
for a window cut from the middle of a stream.  These tests compare the
windows ``posenc.lab`` builds with independent fresh samples by two-sample
statistics (first-token repeats: a two-proportion z-test; bigram counts: a
chi-square test of homogeneity), and show that the same statistics reject
windows cut from a stream, so the bug cannot come back unnoticed.
"""

import dataclasses

import pytest
import torch
from scipy import stats

import posenc.lab as lab

K, L = 4, 8
CONFIG = dataclasses.replace(
    lab.PRESETS["smoke"], train_len=L, curse_factor=K, curse_sequences=1024
)


def _repeat_p(a, b):
    """Two-sided p-value that windows ``a`` and ``b`` repeat their first token equally often."""
    x, y = ((w[:, 1] == w[:, 0]).double() for w in (a, b))
    p = torch.cat([x, y]).mean()
    se = (p * (1 - p) * (1 / len(x) + 1 / len(y))).sqrt()
    z = (x.mean() - y.mean()) / se
    return float(2 * stats.norm.sf(abs(z))), float(x.mean()), float(y.mean())


def _bigram_p(a, b, vocab):
    """Chi-square p-value that ``a`` and ``b`` have the same bigram counts, (x_t, x_{t+1}) at t < 4,
    with the cells pooled by whether the two tokens are equal (the id itself is exchangeable)."""
    rows = []
    for w in (a, b):
        same = (w[:, 1:4] == w[:, :3]).long()
        counts = torch.stack([torch.bincount(same[:, t], minlength=2) for t in range(3)])
        rows.append(counts.flatten().numpy())
    return float(stats.chi2_contingency(rows)[1])


@pytest.fixture(scope="module")
def windows():
    short, long_ = lab.curse_batches(lab.Lab(CONFIG))
    src = lab.LanguageTask().source
    gen = torch.Generator().manual_seed(12345)
    fresh_short = src.sample(len(short), short.shape[1], gen)
    fresh_long = src.sample(len(long_), long_.shape[1], gen)
    return short, long_, fresh_short, fresh_long, src


def test_the_lab_windows_have_the_law_of_fresh_samples(windows):
    short, long_, fresh_short, fresh_long, src = windows
    assert short.shape == (K * 1024, L + 1) and long_.shape == (1024, K * L + 1)
    for ours, fresh in ((short, fresh_short), (long_, fresh_long)):
        p, ours_rate, fresh_rate = _repeat_p(ours, fresh)
        assert p > 1e-3, (p, ours_rate, fresh_rate)
        assert abs(fresh_rate - 1 / src.active) < 0.03  # a fresh pair repeats with 1/active
        assert _bigram_p(ours, fresh, src.vocab) > 1e-3


def test_the_statistics_reject_windows_cut_from_a_stream(windows):
    _, _, fresh_short, fresh_long, src = windows
    stream = fresh_long[:, : K * L]  # 1024 streams of K L tokens, cut at multiples of L
    cut = torch.cat([stream[:, i * L : (i + 1) * L + 1] for i in range(1, K - 1)])
    p, cut_rate, fresh_rate = _repeat_p(cut, fresh_short[: len(cut)])
    assert p < 1e-6 and cut_rate > fresh_rate + 0.1, (p, cut_rate, fresh_rate)
    assert _bigram_p(cut, fresh_short[: len(cut)], src.vocab) < 1e-6


def test_the_floor_drawn_for_short_windows_is_their_expected_loss(windows):
    """The exact predictive's mean loss on the lab's short windows matches the floor
    within 4 standard errors, per position (it sat below it with stream-cut windows)."""
    short, _, _, _, src = windows
    pred = src.predictive(short)[:, 1:]  # row t: p(x_t | x_<t)
    nll = -pred.gather(-1, short[:, 1:, None]).squeeze(-1).log()
    floor = lab.LanguageTask(src).floor(L)
    se = nll.std(0) / len(nll) ** 0.5
    assert ((nll.mean(0) - floor).abs() < 4 * se + 1e-9).all(), (nll.mean(0), floor)
