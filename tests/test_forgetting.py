"""posenc.forgetting: FoX's forget gate against fla's reference, ALiBi, the KV cache and flex.

Golden values come from flash-linear-attention 0.6.0's ``naive_forgetting_attn``
(``fla/ops/forgetting_attn/naive.py``, layout (batch, time, heads, dim), the gate
term added after the softmax scale), over shapes drawn by a seeded generator.
fla computes in float32 (``.float()``); for the float64 comparison its source is
run with ``.float()`` read as ``.double()``, nothing else changed.
"""

from __future__ import annotations

import inspect
import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import ForgetGate, ForgettingAttention, forgetting_attention

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def fla_naive():
    pytest.importorskip("fla")
    from fla.ops.forgetting_attn import naive

    f32 = naive.naive_forgetting_attn
    source = inspect.getsource(f32).replace(".float()", ".double()")
    space = dict(vars(naive))
    exec(source, space)  # noqa: S102  fla's own code, in float64
    return {torch.float32: f32, torch.float64: space["naive_forgetting_attn"]}


def _draw(g: torch.Generator, dtype: torch.dtype):
    """A shape and inputs drawn from ``g``: lengths 1-300, head dims 16-128, GQA, batch > 1."""
    ri = lambda lo, hi: int(torch.randint(lo, hi + 1, (), generator=g))  # noqa: E731
    batch, kv_heads, group = ri(2, 3), ri(1, 2), ri(1, 3)
    heads, t, d = kv_heads * group, ri(1, 300), ri(16, 128)
    q = torch.randn(batch, heads, t, d, generator=g, dtype=dtype)
    k = torch.randn(batch, kv_heads, t, d, generator=g, dtype=dtype)
    v = torch.randn(batch, kv_heads, t, d, generator=g, dtype=dtype)
    # float64: gates from about 0.05 to 1.  float32: gates near 0.95, as trained FoX heads
    # mostly are, since c = cumsum(log f) carries a float32 roundoff of about |c| * 6e-8 in
    # fla and posenc alike (c reaches -400 at 300 tokens with the wide gates: 3e-5 apart)
    logits = torch.randn(batch, heads, t, generator=g)
    logits = 3 * logits if dtype == torch.float64 else 3 + 1.5 * logits
    log_f = torch.nn.functional.logsigmoid(logits).to(dtype)
    window = None if ri(0, 1) else ri(1, t + 2)
    return q, k, v, log_f, window


def _fla(fn, q, k, v, log_f, window, scale=None):
    t = lambda x: x.transpose(1, 2)  # noqa: E731  (batch, heads, time, d) <-> (batch, time, heads, d)
    return t(fn(t(q), t(k), t(v), log_f.transpose(1, 2), scale=scale, window_size=window))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("seed", range(6))
def test_equals_fla_naive_forgetting_attention(fla_naive, dtype, tol, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v, log_f, window = _draw(g, dtype)
    want = _fla(fla_naive[dtype], q, k, v, log_f, window).to(dtype)
    got = forgetting_attention(q, k, v, log_f, window=window, backend="eager")
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    # decoding: the last queries against every key, the rows of fla's full pass
    n = int(torch.randint(1, q.shape[2] + 1, (), generator=g))
    last = forgetting_attention(q[:, :, -n:], k, v, log_f, window=window, backend="eager")
    torch.testing.assert_close(last, want[:, :, -n:], rtol=tol, atol=tol)


def test_the_gate_is_added_after_the_scale(fla_naive):
    """With scale=0.3, fla and posenc both compute 0.3 q.k + (c_i - c_j), not 0.3 (q.k + ...)."""
    g = torch.Generator().manual_seed(7)
    q, k, v, log_f, _ = _draw(g, torch.float64)
    want = _fla(fla_naive[torch.float64], q, k, v, log_f, None, scale=0.3)
    got = forgetting_attention(q, k, v, log_f, scale=0.3)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


# --- the fixed gate is ALiBi ----------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_fixed_gate_equals_alibi_with_slopes_minus_logsigmoid_b(causal):
    g = torch.Generator().manual_seed(0)
    fixed = ForgettingAttention(6, gate="fixed").double()
    with torch.no_grad():
        fixed.gate_logit.copy_(torch.randn(6, generator=g, dtype=torch.float64) * 3)
    alibi = posenc.ALiBi(6)
    alibi.slopes = -torch.nn.functional.logsigmoid(fixed.gate_logit.detach())
    q = torch.randn(2, 6, 9, 16, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 2, 3, 11, 16, generator=g, dtype=torch.float64)
    got = posenc.attention(q, k, v, encoding=fixed, causal=causal)
    want = posenc.attention(q, k, v, encoding=alibi, causal=causal)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    # and the data gate with a constant gate per head gives the same
    log_f = torch.nn.functional.logsigmoid(fixed.gate_logit.detach())[None, :, None]
    table = ForgettingAttention.from_log_f(log_f.expand(1, 6, 11))
    got = posenc.attention(q, k, v, encoding=table, causal=causal)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# --- invariants ---------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(t=st.integers(1, 40), seed=st.integers(0, 2**16), first=st.floats(-30.0, 0.0))
def test_invariants(t, seed, first):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, 2, 3, t, 8, generator=g, dtype=torch.float64)
    zero = torch.zeros(2, 3, t, dtype=torch.float64)
    # log f = 0 (nothing forgotten) is plain causal attention
    plain = posenc.attention(q, k, v, causal=True)
    torch.testing.assert_close(forgetting_attention(q, k, v, zero), plain, rtol=1e-12, atol=1e-12)
    # the first token's gate never matters: it shifts every c by one constant
    log_f = -torch.rand(2, 3, t, generator=g, dtype=torch.float64) * 2
    other = log_f.clone()
    other[..., 0] = first
    torch.testing.assert_close(
        forgetting_attention(q, k, v, other), forgetting_attention(q, k, v, log_f),
        rtol=1e-12, atol=1e-12,
    )  # fmt: skip
    # a smaller gate (more forgetting) never raises a weight on a farther key relative to the
    # query's own: w_ij / w_ii = exp(q.k_j - q.k_i) * prod f, decreasing in every gate
    table = ForgettingAttention.from_log_f(log_f)
    w = posenc.attention_weights(q, k, encoding=table, causal=True)
    w2 = posenc.attention_weights(q, k, encoding=ForgettingAttention.from_log_f(log_f - 0.5),
                                  causal=True)  # fmt: skip
    diag = torch.arange(t)
    r1 = w / w[..., diag, diag][..., None]
    r2 = w2 / w2[..., diag, diag][..., None]
    assert torch.all(r2 <= r1 * (1 + 1e-12))


# --- errors name the parameter --------------------------------------------------------------


def test_errors_name_the_parameter():
    q = torch.randn(1, 2, 4, 8)
    log_f = torch.zeros(1, 2, 4)
    cases = [
        (lambda: forgetting_attention(q, q, q, log_f + 0.1), ValueError, "^log_f must be finite"),
        (lambda: forgetting_attention(q, q, q, log_f - math.inf), ValueError, "^log_f must be"),
        (lambda: forgetting_attention(q, q, q, log_f[..., :3]), ValueError, "^log_f must have"),
        (lambda: forgetting_attention(q, q, q, log_f.long()), TypeError, "^log_f must be a float"),
        (lambda: forgetting_attention(q, q, q, log_f, window=0), ValueError, "^window must be"),
        (lambda: forgetting_attention(q, q, q, log_f, window=2, causal=False), ValueError,
         "^window needs causal=True"),
        (lambda: ForgettingAttention(2, 8, gate="sometimes"), ValueError, "^gate must be one of"),
        (lambda: ForgettingAttention(2, 8, init="zeros"), ValueError, "^init must be one of"),
        (lambda: ForgettingAttention(2), TypeError, "^model_dim must be given"),
        (lambda: ForgettingAttention(2, 8).bind(torch.randn(1, 4, 9)), ValueError, "^x must have"),
        (lambda: ForgettingAttention(2, 8).bind(torch.randn(1, 4, 8), start=-1), ValueError,
         "^start must be"),
        (lambda: ForgetGate(0, 2), ValueError, "^model_dim must be"),
    ]  # fmt: skip
    for call, kind, message in cases:
        with pytest.raises(kind, match=message):
            call()


def test_an_unbound_data_gate_refuses_to_attend_and_says_to_bind():
    fox = ForgettingAttention(2, 8)
    q = torch.randn(1, 2, 4, 8)
    for call in (
        lambda: posenc.attention(q, q, q, encoding=fox, causal=True),
        lambda: posenc.attention_weights(q, q, encoding=fox),
        lambda: posenc.KVCache(fox).update(q, q, q),
    ):
        with pytest.raises(ValueError, match=r"not bound: call scheme.bind\(x\)"):
            call()


def test_positions_outside_the_bound_input_are_refused_or_poisoned():
    fox = ForgettingAttention(2, 8).bind(torch.randn(1, 4, 8))
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"^k_positions must lie within .* 0 \.\. 3"):
        posenc.attention(
            q, q, q, encoding=fox, k_positions=torch.arange(4) + 1, q_positions=torch.arange(4)
        )
    three = ForgettingAttention(2, 8).bind(torch.randn(3, 4, 8))
    q2 = q.expand(2, -1, -1, -1)
    with pytest.raises(ValueError, match="bound to an input of batch 3; the call has batch 2"):
        posenc.attention(q2, q2, q2, encoding=three)
    # traced: no host read, the scores of positions outside the table become NaN
    positions = torch.arange(4) + 1

    def f(q):
        return posenc.attention(q, q, q, encoding=fox, k_positions=positions, q_positions=positions)

    out = torch.compile(f, fullgraph=True, backend="eager")(q)
    assert torch.isnan(out).any()


# --- the gate module --------------------------------------------------------------------------


def test_gate_initialisations():
    torch.manual_seed(0)
    x = torch.randn(2, 50, 64)
    paper = ForgetGate(64, 8)
    assert torch.all(paper.proj.bias == 0) and abs(paper.proj.weight.std().item() - 0.02) < 0.002
    f = paper(x).exp()
    assert f.shape == (2, 8, 50) and abs(f.mean().item() - 0.5) < 0.02
    xt = ForgetGate(64, 8, init="x-transformers")
    assert torch.all(xt.proj.bias == 5.0)
    assert abs(xt(torch.zeros(1, 3, 64)).exp().mean().item() - 1 / (1 + math.exp(-5))) < 1e-6


def test_bind_shares_parameters_and_gradients_reach_the_gate():
    fox = ForgettingAttention(4, 16)
    bound = fox.bind(torch.randn(2, 5, 16))
    assert bound.gate is fox.gate and bound.c is not None and fox.c is None
    assert fox.reads_input and not bound.reads_input
    q = torch.randn(2, 4, 5, 8)
    posenc.attention(q, q, q, encoding=bound, causal=True).sum().backward()
    assert fox.gate.proj.weight.grad is not None and fox.gate.proj.weight.grad.abs().sum() > 0


# --- decoding with the KV cache -----------------------------------------------------------


@pytest.mark.parametrize("gate", ["data", "fixed"])
def test_kv_cache_decoding_equals_the_full_pass(gate):
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    fox = ForgettingAttention(4, 32, gate=gate).double()
    if gate == "fixed":
        with torch.no_grad():
            fox.gate_logit.copy_(torch.tensor([-1.0, 0.0, 1.0, 3.0]))
    x = torch.randn(2, 9, 32, generator=g, dtype=torch.float64)
    q = torch.randn(2, 4, 9, 8, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 2, 2, 9, 8, generator=g, dtype=torch.float64)
    with torch.no_grad():
        full = posenc.attention(q, k, v, encoding=fox.bind(x), causal=True)
        cache = posenc.KVCache(fox.bind(x[:, :4]))  # the prompt
        outs = [cache.attention(cache.update(q[:, :, :4], k[:, :, :4], v[:, :, :4])[0])]
        for t in range(4, 9):  # then one token at a time, each bound to its own input
            cache.encoding = fox.bind(x[:, t : t + 1], start=cache.length)
            q_new = cache.update(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])[0]
            outs.append(cache.attention(q_new))
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-12, atol=1e-12)
    if gate == "data":
        cache.encoding = fox.bind(x[:, :1], start=3)
        with pytest.raises(ValueError, match="start must be the cache's length"):
            cache.update(q[:, :, :1], k[:, :, :1], v[:, :, :1])


# --- FlexAttention ----------------------------------------------------------------------------


flex = pytest.mark.skipif(not posenc.flex_available("cpu"), reason="no FlexAttention here")


@flex
def test_flex_equals_eager_for_a_bound_gate_with_a_window_and_while_decoding():
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    fox = ForgettingAttention(4, 64)
    x = torch.randn(2, 300, 64, generator=g)
    q = torch.randn(2, 4, 300, 32, generator=g)
    k, v = torch.randn(2, 2, 2, 300, 32, generator=g)
    with torch.no_grad():
        bound = fox.bind(x)
        log_f = fox.gate(x)
        for window in (None, 37):
            got = forgetting_attention(q, k, v, log_f, window=window, backend="flex")
            want = forgetting_attention(q, k, v, log_f, window=window, backend="eager")
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        got = posenc.attention(q, k, v, encoding=bound, causal=True, backend="flex")
        want = posenc.attention(q, k, v, encoding=bound, causal=True, backend="eager")
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        cache = posenc.KVCache(fox.bind(x[:, :299]))
        cache.update(q[:, :, :299], k[:, :, :299], v[:, :, :299])
        cache.encoding = fox.bind(x[:, 299:], start=299)
        q_new = cache.update(q[:, :, 299:], k[:, :, 299:], v[:, :, 299:])[0]
        step = cache.attention(q_new, backend="flex")
    torch.testing.assert_close(step, want[:, :, 299:], rtol=1e-5, atol=1e-5)


# --- the lab reads the layer input --------------------------------------------------------


def test_the_lab_binds_the_layer_input():
    from posenc.lab.model import TinyDecoder

    torch.manual_seed(0)
    model = TinyDecoder(vocab=11, scheme="fox", train_len=16, d_model=32, layers=2, heads=4)
    tokens = torch.randint(0, 11, (2, 7))
    logits = model(tokens)
    assert logits.shape == (2, 7, 11) and torch.isfinite(logits).all()
    logits.sum().backward()
    gate = model.blocks[0].encoding.gate.proj.weight
    assert gate.grad is not None and gate.grad.abs().sum() > 0
    # causal: a later token never changes an earlier logit (the gates are causal too)
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 11
    torch.testing.assert_close(model(changed)[:, :-1], logits[:, :-1])
