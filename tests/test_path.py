"""PaTH attention (posenc.path) against flash-linear-attention and against explicit loops.

Golden values come from two independent sources:

* ``fla.ops.path_attn.naive.naive_path_attn`` of flash-linear-attention 0.6.0 (the
  authors' library), which builds the products chunk by chunk (64 tokens) in its own
  order; in float32 as released, and in float64 by running the same function with its
  ``torch.float`` casts pointed at float64 (a module proxy, nothing else changed);
* a float64 loop that multiplies the Householder transforms one by one.

Shapes are drawn by a seeded generator (lengths 1 to 300, head sizes 16 to 128,
grouped-query heads, batch up to 3), not written in this file.
"""

from __future__ import annotations

import math
import os
import random
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import PathAttention, PathGate, PathKVCache, path_attention

os.environ.setdefault("HF_HUB_OFFLINE", "1")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # fla warns that Triton falls back to the CPU
    fla_naive = pytest.importorskip("fla.ops.path_attn.naive")
    fla_fox = pytest.importorskip("fla.ops.forgetting_attn.naive")


# ------------------------------------------------------------------ helpers


def draw_case(seed: int) -> dict[str, int]:
    """A shape drawn from ``seed``: the file fixes the generator, not the shapes."""
    r = random.Random(1_000 + seed)
    kv_heads = r.choice([1, 2, 3])
    return {
        "batch": r.randint(1, 3),
        "kv_heads": kv_heads,
        "heads": kv_heads * r.choice([1, 2, 4]),
        "length": r.randint(1, 300) if seed % 4 else r.randint(1, 24),  # short ones too
        "d": r.randint(16, 128),
    }


CASES = [draw_case(s) for s in range(8)]


def test_the_drawn_shapes_cover_what_the_comparisons_need():
    lengths = [c["length"] for c in CASES]
    assert any(n > 64 and n % 64 for n in lengths)  # several chunks, the last one partial
    assert any(c["heads"] > c["kv_heads"] for c in CASES)  # grouped-query heads
    assert any(c["batch"] > 1 for c in CASES)


def inputs(case, dtype=torch.float64, seed=0, gate=True):
    g = torch.Generator().manual_seed(seed)
    b, h, hk, n, d = case["batch"], case["heads"], case["kv_heads"], case["length"], case["d"]
    q = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, hk, n, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, hk, n, d, generator=g, dtype=torch.float64)
    w = F.normalize(torch.randn(b, hk, n, d, generator=g, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(b, hk, n, generator=g, dtype=torch.float64)
    log_f = F.logsigmoid(2 + 2 * torch.randn(b, h, n, generator=g, dtype=torch.float64))
    out = [t.to(dtype) for t in (q, k, v, w, beta, log_f)]
    if not gate:
        out[-1] = None
    return out


def fla_path(q, k, v, w, beta, log_f, scale, *, float64=False):
    """fla's naive_path_attn in posenc's layout (batch, heads, length, dim)."""
    if log_f is None:
        log_f = torch.zeros(q.shape[:3], dtype=q.dtype)
    args = [t.transpose(1, 2) for t in (q, k, v, w, beta, log_f)]
    if not float64:
        return fla_naive.naive_path_attn(*args, scale).transpose(1, 2)
    # the same function with its torch.float casts (and new tensors) in float64
    proxy = types.SimpleNamespace(**{n: getattr(torch, n) for n in dir(torch)})
    proxy.float = torch.float64
    saved, default = fla_naive.torch, torch.get_default_dtype()
    fla_naive.torch = proxy
    torch.set_default_dtype(torch.float64)
    try:
        return fla_naive.naive_path_attn(*args, scale).transpose(1, 2)
    finally:
        fla_naive.torch = saved
        torch.set_default_dtype(default)


def loop_scores(q, k, w, beta, q_pos, k_pos):
    """Unscaled scores by multiplying the transforms one at a time, float64, one head.

    q (nq, d), k (nk, d), w (L, d), beta (L,).  A key at or before its query is
    carried through H_{p_j+1}, ..., H_{p_i}; a key after it, the query is carried
    through H_{p_i+1}, ..., H_{p_j} (posenc's extension beyond the causal paper).
    """
    out = torch.empty(len(q_pos), len(k_pos), dtype=torch.float64)
    for i, pi in enumerate(q_pos):
        for j, pj in enumerate(k_pos):
            lo, hi = min(pi, pj), max(pi, pj)
            x = (k[j] if pj <= pi else q[i]).clone()
            for s in range(lo + 1, hi + 1):
                x = x - beta[s] * (w[s] @ x) * w[s]
            out[i, j] = q[i] @ x if pj <= pi else k[j] @ x
    return out


def loop_attention(q, k, v, w, beta, log_f, scale, scale_gate=True):
    """Causal PaTH(-FoX) from :func:`loop_scores`, float64, heads expanded by hand."""
    b, h, n, _ = q.shape
    k = k.repeat_interleave(h // k.shape[1], 1)
    v = v.repeat_interleave(h // v.shape[1], 1)
    w = w.repeat_interleave(h // w.shape[1], 1)
    beta = beta.repeat_interleave(h // beta.shape[1], 1)
    out = torch.empty(b, h, n, v.shape[-1], dtype=torch.float64)
    pos = list(range(n))
    for bi in range(b):
        for hi in range(h):
            s = loop_scores(q[bi, hi], k[bi, hi], w[bi, hi], beta[bi, hi], pos, pos)
            gate = torch.zeros(n, n, dtype=torch.float64)
            if log_f is not None:
                for i in range(n):
                    for j in range(i + 1):
                        gate[i, j] = log_f[bi, hi, j + 1 : i + 1].sum()
            logits = scale * (s + gate) if scale_gate else scale * s + gate
            logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
            out[bi, hi] = logits.softmax(-1) @ v[bi, hi]
    return out


# ------------------------------------------------------------------ against fla


@pytest.mark.parametrize("gate", [False, True], ids=["path", "path_fox"])
@pytest.mark.parametrize("index", range(len(CASES)))
def test_equals_fla_naive_in_float32(index, gate):
    case = CASES[index]
    q, k, v, w, beta, log_f = inputs(case, torch.float32, seed=index, gate=gate)
    scale = case["d"] ** -0.5
    want = fla_path(q, k, v, w, beta, log_f, scale)
    got = path_attention(q, k, v, w, beta, log_f=log_f)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("gate", [False, True], ids=["path", "path_fox"])
@pytest.mark.parametrize("index", range(len(CASES)))
def test_equals_fla_naive_in_float64(index, gate):
    case = CASES[index]
    q, k, v, w, beta, log_f = inputs(case, seed=index, gate=gate)
    scale = case["d"] ** -0.5
    want = fla_path(q, k, v, w, beta, log_f, scale, float64=True)
    assert want.dtype == torch.float64
    torch.testing.assert_close(
        path_attention(q, k, v, w, beta, log_f=log_f), want, rtol=0, atol=1e-10
    )


def test_the_float64_reference_is_not_the_float32_one():
    # the proxy must reach fla's casts: otherwise the 1e-10 comparison would be vacuous
    case = {"batch": 1, "heads": 2, "kv_heads": 1, "length": 90, "d": 32}
    q, k, v, w, beta, log_f = inputs(case)
    hi = fla_path(q, k, v, w, beta, log_f, 0.2, float64=True)
    lo = fla_path(q, k, v, w, beta, log_f, 0.2)
    assert 1e-9 < (hi - lo).abs().max() < 1e-4


@pytest.mark.parametrize("index", [0, 3, 5])
def test_both_gate_conventions_against_fla(index):
    """scale_gate=True is fla's PaTH-FoX; False is FoX's convention, checked two ways."""
    case = CASES[index]
    q, k, v, w, beta, log_f = inputs(case, seed=index)
    scale = 1 / 3
    before = path_attention(q, k, v, w, beta, log_f=log_f, scale=scale)
    want = fla_path(q, k, v, w, beta, log_f, scale, float64=True)
    torch.testing.assert_close(before, want, rtol=0, atol=1e-10)
    after = path_attention(q, k, v, w, beta, log_f=log_f, scale=scale, scale_gate=False)
    # FoX's convention is PaTH's with the gate divided by the scale
    want = fla_path(q, k, v, w, beta, log_f / scale, scale, float64=True)
    torch.testing.assert_close(after, want, rtol=0, atol=1e-10)
    assert (after - before).abs().max() > 1e-3  # the two conventions differ
    # with beta = 0 PaTH-FoX is FoX: fla's own FoX reference adds the gate after the scale
    zero = torch.zeros_like(beta)
    got = path_attention(q, k, v, w, zero, log_f=log_f, scale=scale, scale_gate=False)
    fox = fla_fox.naive_forgetting_attn(
        *(t.transpose(1, 2) for t in (q, k, v, log_f)), scale=scale
    ).transpose(1, 2)
    torch.testing.assert_close(got, fox.to(got.dtype), rtol=0, atol=1e-5)  # fla casts to fp32


# ------------------------------------------------------------------ against the loop


@pytest.mark.parametrize("scale_gate", [True, False])
def test_equals_the_product_of_transforms_taken_one_by_one(scale_gate):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 4, 13, 6, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 2, 2, 13, 6, generator=g, dtype=torch.float64)
    w = torch.randn(2, 2, 13, 6, generator=g, dtype=torch.float64)  # not unit: normalised
    beta = 2 * torch.rand(2, 2, 13, generator=g, dtype=torch.float64)
    beta[0, 0, 3], beta[1, 1, 5], beta[0, 1, 7] = 0.0, 1.0, 2.0  # identity, projection, mirror
    log_f = F.logsigmoid(torch.randn(2, 4, 13, generator=g, dtype=torch.float64))
    want = loop_attention(q, k, v, F.normalize(w, dim=-1), beta, log_f, 0.3, scale_gate)
    got = path_attention(q, k, v, w, beta, log_f=log_f, scale=0.3, scale_gate=scale_gate)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 3, 4, 64])
def test_chunked_scores_equal_the_loop_for_any_chunk(chunk):
    """path_attention's O(L^2 d) scores, with chunks short enough to cross several."""
    g = torch.Generator().manual_seed(chunk)
    q, k, w = torch.randn(3, 2, 14, 5, generator=g, dtype=torch.float64)
    w = F.normalize(w, dim=-1)
    beta = 2 * torch.rand(2, 14, generator=g, dtype=torch.float64)
    got = posenc.path._chunked_scores(q, k, w, beta, chunk)
    pos = list(range(14))
    for h in range(2):
        want = loop_scores(q[h], k[h], w[h], beta[h], pos, pos).tril()
        torch.testing.assert_close(got[h].tril(), want, rtol=0, atol=1e-12)


def test_scheme_scores_at_any_positions_equal_the_loop():
    """The bound scheme at explicit positions, keys before and after their queries."""
    torch.manual_seed(0)
    scheme = PathAttention(2, 5, model_dim=7).double()
    x = torch.randn(1, 20, 7, dtype=torch.float64)
    bound = scheme.bind(x)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 4, 5, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 6, 5, generator=g, dtype=torch.float64)
    q_pos, k_pos = [3, 11, 11, 19], [0, 2, 7, 11, 15, 19]
    ctx = posenc.CallContext.of(
        q, k, q_positions=torch.tensor(q_pos), k_positions=torch.tensor(k_pos)
    )
    got = bound.logits(q, k, ctx) / ctx.scale
    w, beta, _ = scheme.gate(x)
    for h in range(2):
        want = loop_scores(q[0, h], k[0, h], w[0, h], beta[0, h], q_pos, k_pos)
        torch.testing.assert_close(got[0, h], want, rtol=0, atol=1e-12)
    # exchanging the roles of query and key leaves a score unchanged (same bilinear form)
    ctx_t = posenc.CallContext.of(
        k, q, q_positions=torch.tensor(k_pos), k_positions=torch.tensor(q_pos)
    )
    torch.testing.assert_close(bound.logits(k, q, ctx_t), got.mT * ctx.scale, rtol=0, atol=1e-12)


@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize("length", [9, 64, 150])
def test_causal_attention_by_chunks_equals_the_solve_and_its_gradients(gate, length):
    """A causal call over the bound tokens takes the chunked scores: same output and
    gradients as the full solve of :meth:`logits` (the lab trains through it), with a
    window mask and GQA; a call at other positions keeps the solve."""
    torch.manual_seed(1)
    scheme = PathAttention(4, 8, model_dim=24, kv_heads=2, forget_gate=gate).double()
    x = torch.randn(2, length, 24, dtype=torch.float64, requires_grad=True)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, length, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = torch.randn(2, 2, 2, length, 8, generator=g, dtype=torch.float64)
    k.requires_grad_(True)
    i = torch.arange(length)
    window = (i[:, None] - i[None, :]) < 5  # a sliding window of 5 keys
    bound = scheme.bind(x)
    got = posenc.attention(q, k, v, encoding=bound, causal=True, mask=window)
    ctx = posenc.CallContext.of(q, k, causal=True)
    logits = bound.logits(q, k, ctx)  # the O(L^3) solve, every entry
    keep = window & (i[:, None] >= i[None, :])
    want = torch.softmax(logits.masked_fill(~keep, -torch.inf), -1) @ v.repeat_interleave(2, 1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    grads = torch.autograd.grad(got.square().sum(), (q, k, x), retain_graph=True)
    wants = torch.autograd.grad(want.square().sum(), (q, k, x))
    for a, b in zip(grads, wants, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    # shifted key positions are not the bound tokens' own: the solve answers
    shifted = torch.arange(length).roll(1)
    ctx_s = posenc.CallContext.of(q, k, causal=True, k_positions=shifted)
    assert not bound._masked_logits(q, k, ctx_s).tril().equal(logits.tril())


def test_a_layer_that_binds_in_its_forward_compiles_whole():
    """bind() inside a compiled forward: no graph break (fullgraph=True), the same output
    and gradients as eager (a model holds the unbound scheme and binds per call)."""

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scheme = PathAttention(2, 8, model_dim=16, forget_gate=True)
            self.qkv = torch.nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = self.qkv(x).view(*x.shape[:2], 3, 2, 8).permute(2, 0, 3, 1, 4)
            return posenc.attention(q, k, v, encoding=self.scheme.bind(x), causal=True)

    torch.manual_seed(0)
    layer = Layer()
    x = torch.randn(2, 12, 16, requires_grad=True)
    torch._dynamo.reset()
    try:
        got = torch.compile(layer, fullgraph=True, backend="eager")(x)
    finally:
        torch._dynamo.reset()
    want = layer(x)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    (g,) = torch.autograd.grad(got.sum(), x)
    (w,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ RoPE


def test_two_reflections_make_a_rotation_by_twice_the_angle_between_the_mirrors():
    """(I - 2vv^T)(I - 2uu^T), unit u, v at angle t: the rotation by 2t in span(u, v).

    Proof: both reflections fix the orthogonal complement of span(u, v) pointwise, so
    their product does.  In the plane, a reflection across the line at angle a is
    [[cos 2a, sin 2a], [sin 2a, -cos 2a]]; the product of those at angles b and a is
    [[cos 2(b-a), -sin 2(b-a)], [sin 2(b-a), cos 2(b-a)]], the rotation by 2(b - a),
    and the mirrors' lines are at the same angle to each other as their normals u, v.
    """
    g = torch.Generator().manual_seed(5)
    for d in (2, 3, 8, 64):
        u, v = F.normalize(torch.randn(2, d, generator=g, dtype=torch.float64), dim=-1)
        eye = torch.eye(d, dtype=torch.float64)
        m = (eye - 2 * torch.outer(v, v)) @ (eye - 2 * torch.outer(u, u))
        torch.testing.assert_close(m @ m.T, eye, rtol=0, atol=1e-13)  # orthogonal
        assert abs(torch.linalg.det(m).item() - 1) < 1e-12  # a rotation, not a reflection
        theta = math.acos((u @ v).item())
        e1 = u
        e2 = F.normalize(v - (u @ v) * u, dim=0)  # orthonormal basis of the plane, from u to v
        c, s = math.cos(2 * theta), math.sin(2 * theta)
        rot = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
        basis = torch.stack([e1, e2], dim=1)
        torch.testing.assert_close(basis.T @ m @ basis, rot, rtol=0, atol=1e-12)
        rest = eye - basis @ basis.T  # projector on the complement: left alone
        torch.testing.assert_close(m @ rest, rest, rtol=0, atol=1e-12)


def test_alternating_mirrors_give_rope_at_even_distances():
    """Mirrors at angles -t (beta = 2, d = 2): PaTH's score at an even distance i - j is
    RoPE's with frequency 1 (posenc.RotaryEmbedding(2)); at an odd distance one
    reflection is left over and it is not."""
    n = 12
    angles = -torch.arange(n, dtype=torch.float64)
    w = torch.stack([torch.cos(angles), torch.sin(angles)], -1)[None, None]
    beta = torch.full((1, 1, n), 2.0, dtype=torch.float64)
    scheme = PathAttention(1, 2)._bound_to(w, beta, None)
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 1, 1, n, 2, generator=g, dtype=torch.float64)
    ctx = posenc.CallContext.of(q, k, causal=True)
    path = scheme.logits(q, k, ctx)
    rope = posenc.RotaryEmbedding(2)
    assert rope.inv_freq.tolist() == [1.0]
    qr, kr = rope.rotate(q, k, ctx)
    rope_logits = ctx.scale * qr @ kr.mT
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    even, odd = (j <= i) & ((i - j) % 2 == 0), (j <= i) & ((i - j) % 2 == 1)
    torch.testing.assert_close(path[0, 0][even], rope_logits[0, 0][even], rtol=0, atol=1e-12)
    assert (path[0, 0][odd] - rope_logits[0, 0][odd]).abs().min() > 1e-6


# ------------------------------------------------------------------ invariants

small = st.integers(min_value=1, max_value=9)


@settings(max_examples=30, deadline=None)
@given(n=small, d=st.integers(2, 6), seed=st.integers(0, 2**16), kv=st.sampled_from([1, 2]))
def test_invariants(n, d, seed, kv):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, n, d, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 1, kv, n, d, generator=g, dtype=torch.float64)
    w = torch.randn(1, kv, n, d, generator=g, dtype=torch.float64)
    beta = 2 * torch.rand(1, kv, n, generator=g, dtype=torch.float64)
    log_f = -torch.rand(1, 2, n, generator=g, dtype=torch.float64)
    out = path_attention(q, k, v, w, beta, log_f=log_f)
    # beta = 0: every transform is the identity, FoX remains (and with no gate, SDPA)
    plain = path_attention(q, k, v, w, torch.zeros_like(beta))
    torch.testing.assert_close(plain, posenc.attention(q, k, v, causal=True), rtol=0, atol=1e-12)
    # only the direction of w counts, and its sign not at all (H depends on w w^T)
    c = 0.1 + 3 * torch.rand(1, kv, n, 1, generator=g, dtype=torch.float64)
    sign = torch.where(torch.rand(1, kv, n, 1, generator=g) < 0.5, -1.0, 1.0).double()
    again = path_attention(q, k, v, w * c * sign, beta, log_f=log_f)
    torch.testing.assert_close(again, out, rtol=0, atol=1e-12)
    # one orthogonal change of basis of q, k and w together changes nothing
    rot, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    turned = path_attention(q @ rot, k @ rot, v, w @ rot, beta, log_f=log_f)
    torch.testing.assert_close(turned, out, rtol=0, atol=1e-11)
    # causal: changing the last token changes no earlier output
    q2, k2, v2, w2, b2 = (t.clone() for t in (q, k, v, w, beta))
    for t in (q2, k2, v2, w2):
        t[..., -1, :] = torch.randn(t[..., -1, :].shape, generator=g, dtype=torch.float64)
    b2[..., -1] = 2 * torch.rand(b2[..., -1].shape, generator=g, dtype=torch.float64)
    later = path_attention(q2, k2, v2, w2, b2, log_f=log_f)
    torch.testing.assert_close(later[..., :-1, :], out[..., :-1, :], rtol=0, atol=1e-12)


# ------------------------------------------------------------------ decoding


@pytest.mark.parametrize(
    "heads, kv_heads, w_heads", [(4, 2, 2), (4, 4, 4), (6, 2, 3), (4, 1, 4)]
)  # fmt: skip
@pytest.mark.parametrize("gate", [False, True])
def test_cache_decoding_equals_the_full_pass(heads, kv_heads, w_heads, gate):
    g = torch.Generator().manual_seed(heads * 10 + w_heads)
    n = 23
    q = torch.randn(2, heads, n, 8, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 2, kv_heads, n, 8, generator=g, dtype=torch.float64)
    w = F.normalize(torch.randn(2, w_heads, n, 8, generator=g, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(2, w_heads, n, generator=g, dtype=torch.float64)
    log_f = (
        F.logsigmoid(torch.randn(2, heads, n, generator=g, dtype=torch.float64)) if gate else None
    )
    full = path_attention(q, k, v, w, beta, log_f=log_f)
    cache = PathKVCache()
    outs = []
    for a, b in ((0, 9), (9, 10), (10, 11), (11, 17), *((t, t + 1) for t in range(17, n))):
        sl = slice(a, b)
        lf = None if log_f is None else log_f[:, :, sl]
        outs.append(
            cache.update(q[:, :, sl], k[:, :, sl], v[:, :, sl], w[:, :, sl], beta[:, :, sl], lf)
        )
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=0, atol=1e-12)
    assert cache.length == n and cache.keys.shape[1] == math.lcm(kv_heads, w_heads)
    # the cached keys are the keys carried through every later transform, one by one
    key = k[1, 0, 4].clone()
    h = 0  # the stored head 0 uses key head 0 and w head 0
    for s in range(5, n):
        key = key - beta[1, h, s] * (w[1, h, s] @ key) * w[1, h, s]
    torch.testing.assert_close(cache.keys[1, 0, 4], key, rtol=0, atol=1e-13)


@pytest.mark.parametrize("gate", [False, True])
def test_cache_with_a_long_prompt_and_a_long_update(gate):
    """A prompt of several chunks (carried chunk by chunk), then 70 tokens, then steps."""
    case = {"batch": 2, "heads": 4, "kv_heads": 2, "length": 230, "d": 16}
    q, k, v, w, beta, log_f = inputs(case, seed=11, gate=gate)
    full = path_attention(q, k, v, w, beta, log_f=log_f)
    cache = PathKVCache()
    outs = []
    for a, b in ((0, 150), (150, 220), *((t, t + 1) for t in range(220, 230))):
        sl = slice(a, b)
        lf = None if log_f is None else log_f[:, :, sl]
        outs.append(
            cache.update(q[:, :, sl], k[:, :, sl], v[:, :, sl], w[:, :, sl], beta[:, :, sl], lf)
        )
        assert cache.length == b
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=0, atol=1e-11)


@pytest.mark.parametrize("chunk", [1, 3, 5, 64])
def test_keys_carried_by_chunks_equal_the_loop(chunk):
    g = torch.Generator().manual_seed(chunk)
    k, w = torch.randn(2, 2, 13, 4, generator=g, dtype=torch.float64)
    w = F.normalize(w, dim=-1)
    beta = 2 * torch.rand(2, 13, generator=g, dtype=torch.float64)
    got = posenc.path._carried_to_end(k, w, beta, chunk)
    for h in range(2):
        for j in range(13):
            x = k[h, j].clone()
            for s in range(j + 1, 13):
                x = x - beta[h, s] * (w[h, s] @ x) * w[h, s]
            torch.testing.assert_close(got[h, j], x, rtol=0, atol=1e-12)


def test_the_gate_decodes_from_its_last_conv_size_inputs():
    """A decoding step runs PathGate on the last conv_size inputs and keeps the last row."""
    torch.manual_seed(0)
    scheme = PathAttention(4, 8, kv_heads=2, forget_gate=True).double()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    q = torch.randn(2, 4, 11, 8, dtype=torch.float64)
    k, v = torch.randn(2, 2, 2, 11, 8, dtype=torch.float64)
    full = posenc.attention(q, k, v, encoding=scheme.bind(x), causal=True)
    assert scheme.gate is not None
    cache = PathKVCache()
    w, beta, log_f = scheme.gate(x[:, :6])
    outs = [cache.update(q[:, :, :6], k[:, :, :6], v[:, :, :6], w, beta, log_f)]
    for t in range(6, 11):
        w, beta, log_f = (u[..., -1:, :] if u.dim() == 4 else u[..., -1:]
                          for u in scheme.gate(x[:, t - 2 : t + 1]))  # fmt: skip
        sl = slice(t, t + 1)
        outs.append(cache.update(q[:, :, sl], k[:, :, sl], v[:, :, sl], w, beta, log_f))
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ the gate module


def test_gate_matches_explicit_loops_and_fla_layer_shapes():
    from fla.layers.path_attn import PaTHAttention

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = PaTHAttention(hidden_size=64, num_heads=4, num_kv_heads=2, use_forget_gate=True)
    gate = PathGate(64, 4, 16, kv_heads=2, forget_gate=True)
    mapping = {
        "w_proj.0.weight": "w_proj.0.weight", "w_proj.1.weight": "w_proj.1.weight",
        "w_conv.weight": "w_conv1d.weight", "beta_proj.weight": "bt_proj.weight",
        "beta_proj.bias": "bt_proj.bias", "f_proj.weight": "g_proj.weight",
        "f_proj.bias": "g_proj.bias",
    }  # fmt: skip
    fla_state = layer.state_dict()
    gate.load_state_dict({ours: fla_state[theirs] for ours, theirs in mapping.items()})
    assert sum(p.numel() for p in gate.parameters()) == sum(
        fla_state[n].numel() for n in mapping.values()
    )
    gate = gate.double()
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    w, beta, log_f = gate(x)
    # fla's formulas for beta and g (layers/path_attn.py, forward)
    torch.testing.assert_close(
        beta, (layer.bt_proj.double()(x).sigmoid() * 2).mT, rtol=0, atol=1e-14
    )
    torch.testing.assert_close(log_f, F.logsigmoid(layer.g_proj.double()(x)).mT, rtol=0, atol=1e-14)
    # w: projection, causal depthwise convolution of width 3 with SiLU, unit norm per head
    p = layer.w_proj.double()(x)  # (2, 9, 32)
    kernel = layer.w_conv1d.weight.double()[:, 0]  # (32, 3)
    for b in range(2):
        for t in range(9):
            acc = sum(kernel[:, tau] * p[b, t - 2 + tau] for tau in range(3) if t - 2 + tau >= 0)
            acc = F.silu(acc).view(2, 16)
            torch.testing.assert_close(
                w[b, :, t], acc / acc.norm(dim=-1, keepdim=True), rtol=0, atol=1e-14
            )


# ------------------------------------------------------------------ errors


def test_errors_name_the_parameter():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 5, 4, generator=g)
    w = torch.randn(1, 2, 5, 4, generator=g)
    beta = torch.rand(1, 2, 5, generator=g)
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
        path_attention(q, k, v, w, beta + 2)
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
        path_attention(q, k, v, w, beta - 2)
    zero = w.clone()
    zero[0, 1, 3] = 0
    with pytest.raises(ValueError, match="w must have no zero vector"):
        path_attention(q, k, v, zero, beta)
    with pytest.raises(ValueError, match="log_f must be <= 0"):
        path_attention(q, k, v, w, beta, log_f=torch.full((1, 2, 5), 0.1))
    with pytest.raises(ValueError, match="log_f must have shape"):
        path_attention(q, k, v, w, beta, log_f=torch.zeros(1, 5))
    with pytest.raises(ValueError, match=r"w must have shape \(batch, w_heads, length, head_dim\)"):
        path_attention(q, k, v, w[:, :, :4], beta)
    with pytest.raises(ValueError, match=r"w_heads \(w.shape\[1\] = 3\) must divide"):
        path_attention(q, k, v, torch.randn(1, 3, 5, 4), torch.rand(1, 3, 5))
    with pytest.raises(ValueError, match="beta must have shape"):
        path_attention(q, k, v, w, beta[..., :4])
    with pytest.raises(TypeError, match="beta must be a floating-point tensor"):
        path_attention(q, k, v, w, (beta > 0.5).long())
    with pytest.raises(TypeError, match="scale_gate must be True or False"):
        path_attention(q, k, v, w, beta, scale_gate=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kv_heads"):
        path_attention(q, torch.randn(1, 3, 5, 4), torch.randn(1, 3, 5, 4), w, beta)


def test_scheme_errors():
    scheme = PathAttention(2, 4)
    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"call scheme.bind\(x\)"):
        posenc.attention(q, q, q, encoding=scheme, causal=True)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, length, model_dim=8\)"):
        scheme.bind(torch.randn(1, 5, 7))
    bound = scheme.bind(torch.randn(1, 5, 8))
    assert bound.bound and not scheme.bound and not bound.reads_input and scheme.reads_input
    assert not list(bound.parameters())  # the gate's parameters stay with the unbound scheme
    with pytest.raises(ValueError, match="already bound"):
        bound.bind(torch.randn(1, 5, 8))
    with pytest.raises(
        ValueError, match=r"k_positions must index the tokens of the bound input, 0 .. 4"
    ):
        posenc.attention(
            q, q, q, encoding=bound, k_positions=torch.arange(5) + 1, q_positions=torch.arange(5)
        )
    with pytest.raises(ValueError, match="does not fit q with batch 1, 3 heads"):
        posenc.attention(torch.randn(1, 3, 5, 4), q[:, :1], q[:, :1], encoding=bound)
    with pytest.raises(ValueError, match="cannot express encoding PathAttention"):
        posenc.attention(q, q, q, encoding=bound, backend="flex", causal=True)
    assert not PathAttention.fused() and PathAttention.reference == "yang2025path"
    with pytest.raises(ValueError, match="kv_heads must divide num_heads"):
        PathAttention(4, 8, kv_heads=3)
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        PathGate(8, 2, 4, rank=0)


def test_cache_errors():
    cache = PathKVCache()
    q, k, v = torch.randn(3, 1, 2, 1, 4)
    w, beta = F.normalize(torch.randn(1, 2, 1, 4), dim=-1), torch.rand(1, 2, 1)
    cache.update(q, k, v, w, beta)
    with pytest.raises(ValueError, match="log_f must be given on every update or on none"):
        cache.update(q, k, v, w, beta, torch.zeros(1, 2, 1))
    with pytest.raises(ValueError, match="must match the cache's"):
        cache.update(q[..., :2], k[..., :2], v[..., :2], w[..., :2], beta)
    with pytest.raises(ValueError, match=r"w must have shape"):
        cache.update(q, k, v, w[:, :, :0], beta)
    cache.reset()
    assert cache.length == 0 and cache.keys is None
