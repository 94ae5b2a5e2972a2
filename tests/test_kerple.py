"""Tests for posenc.kerple: the bias against float64 loops, its CPD sign, gradients and errors."""

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc

HEADS = 3

# --- references -----------------------------------------------------------------------------


def reference_bias(kind, r1, r2, qpos, kpos):
    """float64 loop of the paper's two kernels, (heads, q_len, k_len)."""
    out = torch.zeros(len(r1), len(qpos), len(kpos), dtype=torch.float64)
    for h in range(len(r1)):
        for i, m in enumerate(qpos):
            for j, n in enumerate(kpos):
                if kind == "log":
                    out[h, i, j] = -r1[h] * math.log(1 + r2[h] * abs(m - n))
                else:
                    out[h, i, j] = -r1[h] * abs(m - n) ** r2[h]
    return out


def reference_attention(q, k, v, bias, *, causal, q_offset):
    """Explicit float64 softmax loop; q (H, Lq, d), k and v (H, Lk, d), bias (H, Lq, Lk)."""
    heads, q_len, d = q.shape
    out = torch.zeros(heads, q_len, v.shape[-1], dtype=torch.float64)
    for h in range(heads):
        for i in range(q_len):
            scores = []
            for j in range(k.shape[1]):
                if causal and j > q_offset + i:
                    continue
                scores.append((j, float(q[h, i] @ k[h, j]) / math.sqrt(d) + float(bias[h, i, j])))
            top = max(s for _, s in scores)
            total = sum(math.exp(s - top) for _, s in scores)
            for j, s in scores:
                out[h, i] += math.exp(s - top) / total * v[h, j].double()
    return out


def kerple(kind, r1=(0.5, 1.0, 2.0), r2=(0.3, 1.0, 1.7)):
    return posenc.Kerple(HEADS, kind, r1=list(r1), r2=list(r2), dtype=torch.float64)


def dense_bias(scheme, qpos, kpos):
    """The scheme's eager bias at the given positions, ``(heads, q_len, k_len)``, float64."""
    q = torch.zeros(1, scheme.num_heads, len(qpos), 4, dtype=torch.float64)
    k = torch.zeros(1, scheme.num_heads, len(kpos), 4, dtype=torch.float64)
    ctx = posenc.CallContext.of(q, k, q_positions=qpos, k_positions=kpos)
    return scheme.bias(q, k, ctx).expand(1, scheme.num_heads, len(qpos), len(kpos))[0]


def bias_matrix(scheme, positions):
    """The scheme's dense bias over ``positions`` (queries and keys alike), (heads, n, n)."""
    return dense_bias(scheme, list(positions), list(positions))


# --- the formula -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["log", "power"])
def test_bias_matches_float64_loop(kind):
    scheme = kerple(kind)
    qpos, kpos = [0, 3, 7, 100], [0, 1, 3, 50, 100, 2000]
    got = dense_bias(scheme, qpos, kpos)
    want = reference_bias(kind, [0.5, 1.0, 2.0], [0.3, 1.0, 1.7], qpos, kpos)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=0)


@pytest.mark.parametrize("kind", ["log", "power"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_float64_loop(kind, causal):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(HEADS, 4, 8, generator=g, dtype=torch.float64)
    k = torch.randn(HEADS, 6, 8, generator=g, dtype=torch.float64)
    v = torch.randn(HEADS, 6, 8, generator=g, dtype=torch.float64)
    scheme = kerple(kind)
    out = posenc.attention(q, k, v, encoding=scheme, causal=causal)
    bias = reference_bias(kind, [0.5, 1.0, 2.0], [0.3, 1.0, 1.7], range(2, 6), range(6))
    want = reference_attention(q, k, v, bias, causal=causal, q_offset=2)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_power_with_unit_exponent_is_alibi_with_slopes_r1():
    slopes = posenc.alibi_slopes(8)
    scheme = posenc.Kerple(8, "power", r1=slopes, r2=1.0, dtype=torch.float64)
    want = bias_matrix(posenc.ALiBi(8), range(9))
    torch.testing.assert_close(bias_matrix(scheme, range(9)), want, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("kind", ["log", "power"])
def test_bias_is_zero_on_the_diagonal_negative_off_it_and_decreasing(kind):
    b = bias_matrix(kerple(kind), range(40))
    assert torch.all(b.diagonal(dim1=-2, dim2=-1) == 0)
    off = ~torch.eye(40, dtype=torch.bool)
    assert torch.all(b[:, off] < 0)
    torch.testing.assert_close(b, b.transpose(-1, -2), rtol=0, atol=0)  # symmetric in m, n
    row = b[:, 0, :]  # the bias falls with distance
    assert torch.all(row[:, 1:] < row[:, :-1])


# --- conditional positive definiteness ----------------------------------------------------------


def zero_sum_min_eigenvalue(b):
    """Per head, the minimum of c^T b c over unit vectors c with sum(c) = 0."""
    n = b.shape[-1]
    # an orthonormal basis of {c : sum(c) = 0}: the complement of the all-ones direction
    basis = torch.linalg.qr(torch.eye(n, dtype=b.dtype) - 1.0 / n)[0][:, : n - 1]
    return torch.linalg.eigvalsh(basis.T @ b @ basis)[..., 0]


@pytest.mark.parametrize("kind", ["log", "power"])
@given(
    r1=st.floats(0.01, 10.0),
    r2=st.floats(0.01, 1.99),
    positions=st.lists(st.integers(0, 5000), min_size=3, max_size=24, unique=True),
)
def test_bias_is_conditionally_positive_definite(kind, r1, r2, positions):
    """c^T B c >= 0 whenever sum(c) = 0, for the bias B itself (not -B), at any positions."""
    scheme = posenc.Kerple(1, kind, r1=r1, r2=r2, dtype=torch.float64)
    b = bias_matrix(scheme, positions)[0]
    scale = b.abs().max()
    assert zero_sum_min_eigenvalue(b) >= -1e-12 * scale
    # the sign matters: -B is conditionally negative definite, strictly
    assert zero_sum_min_eigenvalue(-b) < 0
    # and the condition matters: without sum(c) = 0, c = 1 gives c^T B c < 0
    ones = torch.ones(len(positions), dtype=torch.float64)
    assert ones @ b @ ones < 0


def test_power_exponent_above_two_would_not_be_cpd():
    """Why r2 <= 2: the same check fails for -|m - n|**2.5, so the check can fail."""
    pos = torch.arange(12, dtype=torch.float64)
    b = -((pos[:, None] - pos[None, :]).abs() ** 2.5)
    assert zero_sum_min_eigenvalue(b) < -1e-3


def test_a_constant_makes_the_bias_psd_only_for_strictly_cpd_forms():
    """The paper's Lemma 1 (CPD + a large constant is PSD) holds for the log form and r2 < 2 only.

    At r2 = 2, which eq-kerple and the paper's Corollary 1 allow, -|m - n|**2 is CPD but not
    strictly, and no constant makes it PSD: exact (rational) witness c = a*1 + z on positions
    (0, 1, 2) with z = (1, -2, 1), so that sum(z) = 0 and sum(z * x) = 0.
    """
    n = 8
    gap = (torch.arange(n, dtype=torch.float64)[:, None] - torch.arange(n)).abs()
    for scheme in [posenc.Kerple(1, "log", r1=1.0, r2=1.0, dtype=torch.float64)] + [
        posenc.Kerple(1, "power", r1=1.0, r2=r2, dtype=torch.float64) for r2 in (0.5, 1.0, 1.9)
    ]:
        b = bias_matrix(scheme, range(n))[0]
        assert torch.linalg.eigvalsh(b + 1e3).min() > 1e-3
    # r2 = 2 (posenc.Kerple stops short of it): negative for every constant tried, in float64 ...
    square = -(gap**2)
    for gamma in (1e0, 1e2, 1e4, 1e6):
        assert torch.linalg.eigvalsh(square + gamma).min() < -10 / gamma  # about -168 / gamma
    # ... and exactly, for any constant gamma: c^T (B + gamma 11^T) c < 0 for a small enough a
    x, z = (0, 1, 2), (1, -2, 1)
    for gamma in (Fraction(0), Fraction(10**3), Fraction(10**12)):
        a = Fraction(6) / (9 * gamma + 16)  # the form is a^2 (9 gamma - 12) - 12 a
        c = [a + zi for zi in z]
        form = sum(
            c[i] * c[j] * (-((x[i] - x[j]) ** 2) + gamma) for i in range(3) for j in range(3)
        )
        assert form < 0
    # the module doc states the lemma's scope
    doc = " ".join(posenc.kerple.__doc__.split())
    assert "false at ``r2 = 2``" in doc


# --- parameters ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["log", "power"])
def test_given_values_are_kept_and_positive(kind):
    scheme = posenc.Kerple(HEADS, kind, r1=[0.5, 1.0, 2.0], r2=[0.3, 1.0, 1.7])
    torch.testing.assert_close(scheme.r1.double(), torch.tensor([0.5, 1.0, 2.0]).double())
    torch.testing.assert_close(scheme.r2.double(), torch.tensor([0.3, 1.0, 1.7]).double())
    assert {n for n, _ in scheme.named_parameters()} == {"raw_r1", "raw_r2"}


@pytest.mark.parametrize("kind", ["log", "power"])
def test_default_initialisation_follows_the_papers_ranges(kind):
    torch.manual_seed(0)
    scheme = posenc.Kerple(256, kind)
    r1_high, r2_high = (2.0, 1.0) if kind == "log" else (1.0, 2.0)
    with torch.no_grad():
        for r, high in ((scheme.r1, r1_high), (scheme.r2, r2_high)):
            assert r.min() >= 0.01 - 1e-6 and r.max() < high
            assert r.max() > 0.9 * high
            assert float(r.mean()) == pytest.approx(high / 2, abs=0.1 * high)


@pytest.mark.parametrize("kind", ["log", "power"])
def test_parameters_stay_in_range_whatever_the_raw_values(kind):
    scheme = posenc.Kerple(HEADS, kind).double()
    with torch.no_grad():
        scheme.raw_r1.copy_(torch.tensor([-50.0, 0.0, 50.0]))
        scheme.raw_r2.copy_(torch.tensor([-50.0, 0.0, 50.0]))
    assert torch.all(scheme.r1 > 0) and torch.all(scheme.r2 > 0)
    if kind == "power":
        assert torch.all(scheme.r2 <= 2)
    b = bias_matrix(scheme, range(30))
    assert torch.isfinite(b).all()


@pytest.mark.parametrize("kind", ["log", "power"])
def test_gradients_reach_r1_and_r2(kind):
    scheme = kerple(kind)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, HEADS, 5, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, HEADS, 5, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, HEADS, 5, 8, generator=g, dtype=torch.float64)
    out = posenc.attention(q, k, v, encoding=scheme, causal=True)
    out.square().sum().backward()
    for p in (scheme.raw_r1, scheme.raw_r2):
        assert p.grad is not None and torch.all(p.grad.abs() > 1e-8)


class _Attend(torch.nn.Module):
    """attention() with a Kerple scheme as a module, for torch.func.functional_call."""

    def __init__(self, scheme):
        super().__init__()
        self.scheme = scheme

    def forward(self, q, k, v):
        return posenc.attention(q, k, v, encoding=self.scheme, causal=True)


@pytest.mark.parametrize("kind", ["log", "power"])
def test_gradcheck_with_respect_to_r1_and_r2(kind):
    model = _Attend(kerple(kind))
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, HEADS, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    raw = [p.detach().clone().requires_grad_() for p in (model.scheme.raw_r1, model.scheme.raw_r2)]

    def f(raw_r1, raw_r2):
        params = {"scheme.raw_r1": raw_r1, "scheme.raw_r2": raw_r2}
        return torch.func.functional_call(model, params, (q, k, v))

    assert torch.autograd.gradcheck(f, tuple(raw))


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"num_heads": 0}, ValueError, "num_heads"),
        ({"num_heads": 2.0}, TypeError, "num_heads"),
        ({"kind": "linear"}, ValueError, "kind"),
        ({"r1": 0.0}, ValueError, "r1"),
        ({"r1": -1.0}, ValueError, "r1"),
        ({"r1": float("nan")}, ValueError, "r1"),
        ({"r1": [1.0, 2.0]}, ValueError, "r1"),
        ({"r2": 0.0}, ValueError, "r2"),
        ({"r2": float("inf")}, ValueError, "r2"),
        ({"kind": "power", "r2": 2.0}, ValueError, "r2"),
        ({"kind": "power", "r2": 2.5}, ValueError, "r2"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, error, names):
    kwargs = {"num_heads": HEADS, **kwargs}
    with pytest.raises(error, match=names):
        posenc.Kerple(**kwargs)


def test_wrong_number_of_query_heads_is_refused():
    q = torch.randn(1, HEADS + 1, 3, 8)
    with pytest.raises(ValueError, match=r"Kerple\(3\).*num_heads=3"):
        posenc.attention(q, q, q, encoding=posenc.Kerple(HEADS))


# --- the fused path -----------------------------------------------------------------------------


@pytest.mark.skipif(not posenc.flex_available("cpu"), reason="FlexAttention cannot compile here")
@pytest.mark.parametrize("kind", ["log", "power"])
def test_flex_matches_float64_loop_without_a_dense_bias(kind, monkeypatch):
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, HEADS, 5, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, HEADS, 7, 8, generator=g, dtype=torch.float64) for _ in range(2))
    scheme = posenc.Kerple(HEADS, kind, r1=[0.5, 1.0, 2.0], r2=[0.3, 1.0, 1.7])

    def no_dense_bias(*args, **kwargs):
        raise AssertionError("the fused path must not build the dense bias")

    monkeypatch.setattr(scheme, "bias", no_dense_bias)
    with torch.no_grad():
        out = posenc.attention(q.float(), k.float(), v.float(), encoding=scheme, backend="flex")
    bias = reference_bias(kind, [0.5, 1.0, 2.0], [0.3, 1.0, 1.7], range(2, 7), range(7))
    want = reference_attention(q[0], k[0], v[0], bias, causal=False, q_offset=2)
    torch.testing.assert_close(out[0].double(), want, rtol=0, atol=2e-6)


@pytest.mark.skipif(not posenc.flex_available("cpu"), reason="FlexAttention cannot compile here")
@pytest.mark.parametrize("table_bits", [-1, 1 << 16], ids=["log1p-per-score", "table"])
def test_log_form_fused_path_matches_eager_with_and_without_its_table(table_bits, monkeypatch):
    # the vector width picks one of the log form's two CPU paths; force each in turn
    monkeypatch.setattr(posenc.kerple, "LOG_TABLE_MAX_VECTOR_BITS", table_bits)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, HEADS, 40, 32, generator=g) for _ in range(3))
    scheme = posenc.Kerple(HEADS, "log", r1=[0.5, 1.0, 2.0], r2=[0.3, 1.0, 1.7])
    assert scheme._table_pays() == (table_bits > 0)  # -1: no vector width is at most -1 bits
    with torch.no_grad():
        got = posenc.attention(q, k, v, encoding=scheme, causal=True, backend="flex")
        want = posenc.attention(q, k, v, encoding=scheme, causal=True, backend="eager")
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
