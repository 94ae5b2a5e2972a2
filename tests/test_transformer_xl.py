"""Tests for posenc.transformer_xl (Dai et al., 2019)."""

import math

import pytest
import torch

from posenc import (
    TransformerXLAttention,
    TransformerXLScheme,
    attention,
    rel_shift,
    relative_sinusoids,
)


def shifted_by_formula(x):
    """y[..., i, j] = x[..., i, j + q_len - 1 - i] where that column exists, else NaN."""
    q_len, k_len = x.shape[-2:]
    y = torch.full_like(x, math.nan)
    for i in range(q_len):
        for j in range(k_len):
            r = j + q_len - 1 - i
            if r < k_len:
                y[..., i, j] = x[..., i, r]
    return y


# --- rel_shift ---------------------------------------------------------------------------------


def test_rel_shift_small_matrix():
    """3 queries, 4 keys: row i of x lists distances 3, 2, 1, 0; y puts distance m + i - j at j."""
    x = torch.tensor(
        [[0.3, 0.2, 0.1, 0.0], [1.3, 1.2, 1.1, 1.0], [2.3, 2.2, 2.1, 2.0]], dtype=torch.float64
    )
    y = rel_shift(x)
    # query i sits at position 1 + i; key j at j; distance 1 + i - j, value i + distance / 10
    for i in range(3):
        for j in range(4):
            if j <= i + 1:
                assert y[i, j] == pytest.approx(i + (1 + i - j) / 10, abs=1e-15)


@pytest.mark.parametrize(("q_len", "k_len"), [(1, 1), (1, 5), (4, 4), (3, 7), (5, 9), (6, 6)])
def test_rel_shift_matches_index_formula(q_len, k_len):
    x = torch.randn(2, 3, q_len, k_len, dtype=torch.float64)
    y = rel_shift(x)
    want = shifted_by_formula(x)
    keep = torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + k_len - q_len
    assert y.shape == x.shape
    assert torch.equal(y[..., keep], want[..., keep])  # a pure data movement: exact
    assert torch.isfinite(y).all()  # the unspecified entries are still finite


def test_rel_shift_not_the_other_way_round():
    """The mirrored shift (labml#185) disagrees with the formula on the kept entries."""
    x = torch.randn(4, 6, dtype=torch.float64)
    mirrored = torch.nn.functional.pad(x, (0, 1)).reshape(6 + 1, 4)[:-1].reshape(4, 6)
    keep = torch.arange(6)[None, :] <= torch.arange(4)[:, None] + 2
    assert not torch.equal(mirrored[keep], rel_shift(x)[keep])


def test_rel_shift_rejects_bad_input():
    with pytest.raises(ValueError, match="x must have at least 2 dimensions"):
        rel_shift(torch.zeros(3))
    with pytest.raises(TypeError, match="x must be a floating-point"):
        rel_shift(torch.zeros(3, 3, dtype=torch.long))


def test_relative_sinusoids_half_layout_and_sign():
    d = torch.tensor([3, 0, -2, 5])
    r = relative_sinusoids(d, 6, dtype=torch.float64)
    for row, dist in enumerate(d.tolist()):
        for i in range(3):
            w = 10000.0 ** (-2 * i / 6)
            assert r[row, i] == pytest.approx(math.sin(dist * w), abs=1e-15)
            assert r[row, 3 + i] == pytest.approx(math.cos(dist * w), abs=1e-15)
    with pytest.raises(ValueError, match="dim must be an even integer"):
        relative_sinusoids(d, 5)
    with pytest.raises(TypeError, match="distances must hold integers"):
        relative_sinusoids(d.double(), 6)


# --- the module --------------------------------------------------------------------------------


def make(d_model=8, heads=2, head_dim=3, **kw):
    torch.manual_seed(1)
    m = TransformerXLAttention(d_model, heads, head_dim, **kw).double()
    with torch.no_grad():  # larger biases than the init, so every term matters
        m.scheme.u.normal_()
        m.scheme.v.normal_()
    return m


# --- an independent reference: the paper's four terms with Python floats ----------------------


def sinusoid(distance, d_model):
    """R_d = [sin(d w_t) for t] + [cos(d w_t) for t], w_t = 10000^(-2t/d_model)."""
    w = [10000.0 ** (-2 * t / d_model) for t in range(d_model // 2)]
    return [math.sin(distance * f) for f in w] + [math.cos(distance * f) for f in w]


def matvec(rows, vec):
    return [sum(a * b for a, b in zip(row, vec, strict=True)) for row in rows]


def dot(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True))


def paper_terms(m, x, mems):
    """Terms (a)-(d) of Dai et al. (2019), eq. 3, from x, [mems; x] and the raw parameters.

    Query i (row i of x) sits at position m + i, key j (row j of [mems; x]) at j, distance
    m + i - j.  Per head h: (a) q_i.k_j, (b) q_i.(W_R R)_h, (c) u_h.k_j, (d) v_h.(W_R R)_h,
    with q_i = W_q x_i, k_j = W_kE [mems; x]_j, everything in Python floats, no torch ops.
    """
    ctx = x if mems is None else torch.cat([mems, x], 1)
    heads, dh, d_model = m.num_heads, m.head_dim, m.d_model
    w_q, w_k = m.w_q.weight.tolist(), m.w_ke.weight.tolist()
    w_r = m.scheme.w_kr.weight.tolist()
    u, v = m.scheme.u.tolist(), m.scheme.v.tolist()
    batch, q_len, k_len = x.shape[0], x.shape[1], ctx.shape[1]
    off = k_len - q_len
    terms = torch.zeros(4, batch, heads, q_len, k_len, dtype=torch.float64)
    for b in range(batch):
        qs = [matvec(w_q, x[b, i].tolist()) for i in range(q_len)]
        ks = [matvec(w_k, ctx[b, j].tolist()) for j in range(k_len)]
        for i in range(q_len):
            for j in range(k_len):
                rk = matvec(w_r, sinusoid(off + i - j, d_model))
                for h in range(heads):
                    cut = slice(h * dh, (h + 1) * dh)
                    q_i, k_j, r_h = qs[i][cut], ks[j][cut], rk[cut]
                    terms[0, b, h, i, j] = dot(q_i, k_j)
                    terms[1, b, h, i, j] = dot(q_i, r_h)
                    terms[2, b, h, i, j] = dot(u[h], k_j)
                    terms[3, b, h, i, j] = dot(v[h], r_h)
    return terms


def paper_forward(m, x, mems):
    """Causal softmax of (a+b+c+d)/sqrt(head_dim) over [mems; x], values and output by loops."""
    ctx = x if mems is None else torch.cat([mems, x], 1)
    logits = paper_terms(m, x, mems).sum(0) / math.sqrt(m.head_dim)
    batch, q_len, k_len, dh = x.shape[0], x.shape[1], ctx.shape[1], m.head_dim
    w_v, w_o = m.w_v.weight.tolist(), m.w_o.weight.tolist()
    out = torch.zeros(batch, q_len, m.d_model, dtype=torch.float64)
    for b in range(batch):
        vals = [matvec(w_v, ctx[b, j].tolist()) for j in range(k_len)]
        for i in range(q_len):
            heads_out = []
            for h in range(m.num_heads):
                row = [float(logits[b, h, i, j]) for j in range(k_len - q_len + i + 1)]
                top = max(row)
                e = [math.exp(r - top) for r in row]
                total = sum(e)
                heads_out += [
                    sum(e[j] / total * vals[j][h * dh + c] for j in range(len(row)))
                    for c in range(dh)
                ]
            out[b, i] = torch.tensor(matvec(w_o, heads_out), dtype=torch.float64)
    return out


@pytest.mark.parametrize("mem", [0, 3])
def test_forward_matches_the_papers_formula(mem):
    m = make()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    mems = torch.randn(2, mem, 8, dtype=torch.float64) if mem else None
    out, _ = m(x, mems)
    torch.testing.assert_close(out, paper_forward(m, x, mems), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mem", [0, 2])
def test_score_terms_are_the_papers_four_terms(mem):
    m = make()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    mems = torch.randn(2, mem, 8, dtype=torch.float64) if mem else None
    want = paper_terms(m, x, mems)
    got = m.score_terms(x, mems)
    for name, g, w in zip("abcd", got, want, strict=True):
        assert g.shape == (2, 2, 5, 5 + mem), name
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12, msg=f"term ({name})")


@pytest.mark.parametrize("mem", [0, 2])
def test_both_fast_forms_of_the_position_terms(mem):
    """(b)+(d) by the paper's rel_shift and by angle addition equal the loop on kept entries."""
    m = make()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    mems = torch.randn(2, mem, 8, dtype=torch.float64) if mem else None
    terms = paper_terms(m, x, mems)
    k_len = 5 + mem
    keep = torch.arange(k_len)[None, :] <= torch.arange(5)[:, None] + mem
    q, _, _ = m.project(x, mems)
    qv = q + m.scheme.v[:, None, :]
    shifted = m.scheme.position_scores(qv, k_len, mem, causal=True)
    direct = m.scheme.position_logits(qv, torch.arange(5) + mem, torch.arange(k_len))
    want = terms[1] + terms[3]
    torch.testing.assert_close(shifted[..., keep], want[..., keep], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(direct, want, rtol=1e-12, atol=1e-12)  # every entry, any sign


def test_memory_equals_rows_of_attention_over_the_concatenation():
    m = make()
    seg1 = torch.randn(2, 3, 8, dtype=torch.float64)
    seg2 = torch.randn(2, 4, 8, dtype=torch.float64)
    full, _ = m(torch.cat([seg1, seg2], 1))
    out1, mems = m(seg1)
    out2, _ = m(seg2, mems)
    torch.testing.assert_close(out1, full[:, :3], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out2, full[:, 3:], rtol=1e-12, atol=1e-12)


def test_new_mems_are_detached_and_sized():
    m = make(mem_len=5)
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    out, mems = m(x)
    assert mems.shape == (2, 3, 8) and not mems.requires_grad
    out2, mems2 = m(torch.randn(2, 4, 8, dtype=torch.float64), mems)
    assert mems2.shape == (2, 5, 8)
    torch.testing.assert_close(mems2[:, :1], x[:, 2:].detach())
    out2.sum().backward()  # no gradient reaches the previous segment through the memory
    assert x.grad is None
    _, none = make(mem_len=0)(x)
    assert none.shape == (2, 0, 8)
    _, default = make()(x)
    assert torch.equal(default, x.detach())


def test_gradcheck_all_parameters():
    m = make(d_model=4, heads=2, head_dim=2)
    x = torch.randn(1, 3, 4, dtype=torch.float64)
    mems = torch.randn(1, 2, 4, dtype=torch.float64)
    params = [m.scheme.u, m.scheme.v, m.scheme.w_kr.weight, m.w_q.weight, m.w_ke.weight]

    def f(u, v, w_r, w_q, w_k):
        return torch.func.functional_call(
            m,
            {
                "scheme.u": u,
                "scheme.v": v,
                "scheme.w_kr.weight": w_r,
                "w_q.weight": w_q,
                "w_ke.weight": w_k,
            },
            (x, mems),
        )[0]

    assert torch.autograd.gradcheck(f, [p.detach().clone().requires_grad_() for p in params])


# --- the scheme through posenc.attention ------------------------------------------------------


def scheme_reference(s, q, k, v, causal, q_offset, q_positions=None, k_positions=None):
    """Softmax of the four-term logits at distance p - s, Python floats, one (b, h, i, j) at a time.

    ``q`` ``(batch, heads, q_len, dh)``; ``k``, ``v`` may have fewer heads (query head h
    uses key head h // (heads // kv_heads)).  Positions default to ``q_offset + i`` and ``j``;
    per-sample positions are lists of lists.  Rows with no visible key are zero.
    """
    batch, heads, q_len, dh = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    w_r, u, vb = s.w_kr.weight.tolist(), s.u.tolist(), s.v.tolist()
    out = torch.zeros(batch, heads, q_len, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        qp = [q_offset + i for i in range(q_len)] if q_positions is None else q_positions[b]
        kp = list(range(k_len)) if k_positions is None else k_positions[b]
        for h in range(heads):
            g = h // (heads // kv_heads)
            for i in range(q_len):
                row = []
                for j in range(k_len):
                    if causal and j > q_offset + i:
                        continue
                    rk = matvec(w_r, sinusoid(qp[i] - kp[j], s.d_model))[h * dh : (h + 1) * dh]
                    q_i, k_j = q[b, h, i].tolist(), k[b, g, j].tolist()
                    score = dot([a + c for a, c in zip(q_i, u[h], strict=True)], k_j)
                    score += dot([a + c for a, c in zip(q_i, vb[h], strict=True)], rk)
                    row.append((j, score / math.sqrt(dh)))
                top = max(r for _, r in row)
                total = sum(math.exp(r - top) for _, r in row)
                for j, r in row:
                    out[b, h, i] += math.exp(r - top) / total * v[b, g, j]
    return out


@pytest.mark.parametrize(
    ("causal", "q_len", "k_len", "q_offset"),
    [(True, 4, 6, None), (True, 3, 6, 1), (True, 2, 5, 7), (False, 4, 6, None), (False, 3, 5, -2)],
)
def test_scheme_through_attention(causal, q_len, k_len, q_offset):
    s = TransformerXLScheme(2, 3, d_model=6).double()
    with torch.no_grad():
        s.u.normal_()
        s.v.normal_()
    q = torch.randn(2, 2, q_len, 3, dtype=torch.float64)
    k = torch.randn(2, 2, k_len, 3, dtype=torch.float64)
    v = torch.randn(2, 2, k_len, 4, dtype=torch.float64)
    got = attention(q, k, v, encoding=s, causal=causal, q_offset=q_offset)
    off = k_len - q_len if q_offset is None else q_offset
    want = scheme_reference(s, q, k, v, causal, off)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_scheme_with_per_sample_positions_and_grouped_heads():
    s = TransformerXLScheme(4, 3, d_model=6).double()
    with torch.no_grad():
        s.u.normal_()
        s.v.normal_()
    q = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    k = torch.randn(2, 2, 5, 3, dtype=torch.float64)
    v = torch.randn(2, 2, 5, 2, dtype=torch.float64)
    k_pos = [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]  # the second sample is left-padded by two
    q_pos = [row[2:] for row in k_pos]
    got = attention(q, k, v, encoding=s, causal=True, k_positions=torch.tensor(k_pos))
    want = scheme_reference(s, q, k, v, True, 2, q_positions=q_pos, k_positions=k_pos)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_large_offset_builds_no_table_that_grows_with_it():
    """One decoding step at position 10**6: angle addition needs no 10**6-row table."""
    s = TransformerXLScheme(2, 3, d_model=6).double()
    q = torch.randn(1, 2, 1, 3, dtype=torch.float64)
    k = torch.randn(1, 2, 3, 3, dtype=torch.float64)
    v = torch.randn(1, 2, 3, 2, dtype=torch.float64)
    pos = [[10**6, 10**6 + 1, 10**6 + 2]]
    got = attention(q, k, v, encoding=s, k_positions=torch.tensor(pos))
    want = scheme_reference(s, q, k, v, False, 2, q_positions=[pos[0][2:]], k_positions=pos)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    # the same relative layout at positions 0, 1, 2: only distances matter
    near = attention(q, k, v, encoding=s)
    torch.testing.assert_close(got, near, rtol=1e-9, atol=1e-9)


def test_scheme_float32_close_to_float64():
    s = TransformerXLScheme(2, 4).double()
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    want = attention(q, k, v, encoding=s, causal=True)
    got = attention(q.float(), k.float(), v.float(), encoding=s, causal=True)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_heads": 0}, ValueError, "num_heads must be a positive integer"),
        ({"head_dim": -1}, ValueError, "head_dim must be a positive integer"),
        ({"d_model": 7}, ValueError, "d_model must be an even integer"),
        ({"mem_len": -1}, ValueError, "mem_len must be a non-negative integer"),
        ({"num_heads": 2.0}, TypeError, "num_heads must be an integer"),
    ],
)
def test_module_validation(kwargs, error, match):
    args = {"d_model": 8, "num_heads": 2, "head_dim": 3} | kwargs
    mem_len = args.pop("mem_len", None)
    with pytest.raises(error, match=match):
        TransformerXLAttention(**args, mem_len=mem_len)


def test_forward_validation():
    m = make()
    with pytest.raises(ValueError, match="x must have shape"):
        m(torch.randn(2, 4, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="x must hold at least one position"):
        m(torch.randn(2, 0, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="mems must have shape"):
        m(torch.randn(2, 4, 8, dtype=torch.float64), torch.randn(3, 2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="TransformerXLScheme needs q of shape"):
        attention(*(torch.randn(1, 3, 4, 3) for _ in range(3)), encoding=m.scheme.float())
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        TransformerXLScheme(0, 4)
