"""Every registered scheme through the same battery, parametrised over ``posenc.SCHEMES``.

Registering a scheme (one line in ``posenc/registry.py``) is all it takes: every
entry that acts on attention, in every variant its class lists in
``examples(num_heads, head_dim)``, is checked for every mask form, grouped-query
heads, per-sample positions of a left-padded batch, step-by-step decoding
(by hand and through ``posenc.KVCache``) against the full causal pass,
``torch.compile(fullgraph=True)``, ``torch.export``, vmap, gradcheck and
gradgradcheck, meta tensors, bf16 against a float64 reference, and the fused
FlexAttention path against the eager one.  What a scheme may differ in is its
metadata (``weights_sum_to_one``, ``output_is_weights_times_v``), never a name
written here.

The references are independent of the code under test where it matters:
masking must equal removing the masked keys (with their positions kept), a
left-padded sample must equal the same sample unpadded, grouped heads must
equal heads repeated by hand, and decoding must equal the last rows of the full
pass.  Each scheme's own formula is checked against explicit loops in its own
test file.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc import attention, attention_weights

HEADS, HEAD_DIM = 4, 8

# (case id, registry name, example label): every variant of every attention scheme
CASES = {
    (name if not label else f"{name}-{label}"): (name, label)
    for name, cls in posenc.SCHEMES.items()
    if cls.acts_on == "attention"
    for label in cls.examples(HEADS, HEAD_DIM)
}


def make(case, dtype=torch.float64, device="cpu"):
    name, label = CASES[case]
    torch.manual_seed(0)  # examples may draw parameters
    scheme = posenc.SCHEMES[name].examples(HEADS, HEAD_DIM)[label]
    return scheme.to(device=device, dtype=dtype)


def qkv(batch=2, q_len=5, k_len=5, kv_heads=HEADS, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, HEADS, q_len, HEAD_DIM, generator=g, dtype=dtype)
    k = torch.randn(batch, kv_heads, k_len, HEAD_DIM, generator=g, dtype=dtype)
    v = torch.randn(batch, kv_heads, k_len, HEAD_DIM, generator=g, dtype=dtype)
    return q, k, v


ALL = list(CASES)


# --- masks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_masking_equals_removing_keys(name):
    """Masking keys out is the same as dropping them (their positions kept)."""
    scheme = make(name)
    q, k, v = qkv(batch=1, q_len=4, k_len=7)
    keep = torch.tensor([True, False, True, True, False, True, True])
    additive = torch.zeros(7, dtype=torch.float64).masked_fill(~keep, -math.inf)
    kept = keep.nonzero().squeeze(-1)
    q_pos = torch.arange(4) + 3
    want = attention(
        q, k[:, :, kept], v[:, :, kept], encoding=scheme, q_positions=q_pos, k_positions=kept
    )
    for kwargs in (
        {"mask": keep[None, None, None, :]},
        {"mask": additive.expand(4, 7)},
        {"bias": keep.expand(4, 7)},  # a boolean bias is a keep-mask
        {"bias": additive[None, None, None, :]},
    ):
        got = attention(q, k, v, encoding=scheme, **kwargs)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_mask_forms_agree_and_weights_use_the_same_masks(name):
    scheme = make(name)
    q, k, v = qkv(k_len=6)
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(2, 1, 5, 6, generator=g) > 0.3
    keep[..., 0] = True
    finite = torch.randn(1, HEADS, 5, 6, generator=g, dtype=torch.float64)
    as_float = finite.masked_fill(~keep, -math.inf)
    by_bool = attention(q, k, v, encoding=scheme, mask=keep, bias=finite, causal=True)
    by_float = attention(q, k, v, encoding=scheme, mask=as_float, causal=True)
    by_bias = attention(q, k, v, encoding=scheme, bias=as_float, causal=True)
    torch.testing.assert_close(by_float, by_bool, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(by_bias, by_bool, rtol=1e-12, atol=1e-12)
    w = attention_weights(q, k, encoding=scheme, mask=keep, bias=finite, causal=True)
    causal = torch.ones(5, 6, dtype=torch.bool).tril(1)
    assert torch.all(w[(~keep).expand_as(w)] == 0) and torch.all(w[..., ~causal] == 0)
    if scheme.weights_sum_to_one:
        torch.testing.assert_close(w.sum(-1), torch.ones(2, HEADS, 5, dtype=torch.float64))
    if scheme.output_is_weights_times_v:
        torch.testing.assert_close(by_bool, w @ v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_integer_and_ambiguous_masks_are_refused(name):
    scheme = make(name)
    q, k, v = qkv()
    ones = torch.ones(2, 1, 1, 5, dtype=torch.long)
    with pytest.raises(TypeError, match="mask must be a boolean keep-mask"):
        attention(q, k, v, encoding=scheme, mask=ones)
    with pytest.raises(TypeError, match="bias must be a boolean keep-mask"):
        attention(q, k, v, encoding=scheme, bias=ones)
    with pytest.raises(ValueError, match="A 3-D mask is ambiguous"):
        attention_weights(q, k, encoding=scheme, mask=torch.ones(2, 5, 5, dtype=torch.bool))


@pytest.mark.parametrize("name", ALL)
def test_query_with_no_visible_key_gets_zeros(name):
    scheme = make(name)
    q, k, v = qkv()
    q.requires_grad_()
    keep = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    keep[0, 0, 3] = False
    out = attention(q, k, v, encoding=scheme, mask=keep, causal=True)
    assert torch.isfinite(out).all() and torch.all(out[0, :, 3] == 0)
    w = attention_weights(q, k, encoding=scheme, mask=keep, causal=True)
    assert torch.isfinite(w).all() and torch.all(w[0, :, 3] == 0)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


# --- grouped-query heads ---------------------------------------------------------------------


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("name", ALL)
def test_grouped_query_heads_equal_repeated_heads(name, kv_heads):
    scheme = make(name)
    q, k, v = qkv(q_len=4, k_len=6, kv_heads=kv_heads)
    keep = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    keep[1, ..., :2] = False
    k_rep = k.repeat_interleave(HEADS // kv_heads, dim=1)
    v_rep = v.repeat_interleave(HEADS // kv_heads, dim=1)
    for causal in (False, True):
        got = attention(q, k, v, encoding=scheme, mask=keep, causal=causal)
        want = attention(q, k_rep, v_rep, encoding=scheme, mask=keep, causal=causal)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        got_w = attention_weights(q, k, encoding=scheme, mask=keep, causal=causal)
        want_w = attention_weights(q, k_rep, encoding=scheme, mask=keep, causal=causal)
        torch.testing.assert_close(got_w, want_w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_head_count_that_does_not_divide_is_refused(name):
    q, k, v = qkv(kv_heads=3)
    with pytest.raises(ValueError, match="k and v must have a number of heads that divides"):
        attention(q, k, v, encoding=make(name))


# --- positions -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_left_padded_sample_equals_the_sample_alone(name):
    """A left-padded batch with per-sample positions gives each sample its unpadded result."""
    scheme = make(name)
    q, k, v = qkv(batch=2, q_len=6, k_len=6)
    pad = 2
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, :pad] = False
    positions = (keep.long().cumsum(-1) - 1).clamp(min=0)  # transformers' position_ids
    out = attention(
        q, k, v, encoding=scheme, causal=True, mask=keep[:, None, None, :], k_positions=positions
    )
    alone = attention(q[1:, :, pad:], k[1:, :, pad:], v[1:, :, pad:], encoding=scheme, causal=True)
    torch.testing.assert_close(out[1:, :, pad:], alone, rtol=1e-12, atol=1e-12)
    full = attention(q[:1], k[:1], v[:1], encoding=scheme, causal=True)
    torch.testing.assert_close(out[:1], full, rtol=1e-12, atol=1e-12)
    assert torch.all(out[1, :, :pad] == 0)  # padding queries see no key


@pytest.mark.parametrize("name", ALL)
def test_per_sample_positions_equal_one_call_per_sample(name):
    scheme = make(name)
    q, k, v = qkv(batch=2, q_len=3, k_len=5, kv_heads=2)
    k_pos = torch.tensor([[0, 1, 2, 3, 4], [10, 12, 13, 17, 18]])
    q_pos = torch.tensor([[2, 3, 4], [13, 17, 40]])
    out = attention(q, k, v, encoding=scheme, q_positions=q_pos, k_positions=k_pos)
    w = attention_weights(q, k, encoding=scheme, q_positions=q_pos, k_positions=k_pos)
    for b in range(2):
        one = attention(
            q[b], k[b], v[b], encoding=scheme, q_positions=q_pos[b], k_positions=k_pos[b]
        )
        torch.testing.assert_close(out[b], one, rtol=1e-12, atol=1e-12)
        one_w = attention_weights(
            q[b], k[b], encoding=scheme, q_positions=q_pos[b], k_positions=k_pos[b]
        )
        torch.testing.assert_close(w[b], one_w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_positions_out_of_range_are_refused(name):
    scheme = make(name)
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k_positions must lie strictly within 2"):
        attention(q, k, v, encoding=scheme, k_positions=torch.arange(5) + (2**63 - 5))
    with pytest.raises(ValueError, match="q_offset must keep every query position"):
        attention(q, k, v, encoding=scheme, q_offset=10**13)
    with pytest.raises(ValueError, match="q_positions must have shape"):
        attention(q, k, v, encoding=scheme, q_positions=torch.zeros(1, 2, 5, dtype=torch.long))


# --- decoding --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_decoding_step_by_step_equals_the_full_causal_pass(name):
    scheme = make(name)
    q, k, v = qkv(q_len=6, k_len=6, kv_heads=2)
    full = attention(q, k, v, encoding=scheme, causal=True)
    for t in range(6):
        # the cache holds keys 0..t; the query is token t
        step = attention(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], encoding=scheme)
        torch.testing.assert_close(step, full[:, :, t : t + 1], rtol=1e-12, atol=1e-12)
        # the same query against the whole cache, future keys masked by q_offset
        step = attention(q[:, :, t : t + 1], k, v, encoding=scheme, causal=True, q_offset=t)
        torch.testing.assert_close(step, full[:, :, t : t + 1], rtol=1e-12, atol=1e-12)
    chunk = attention(q[:, :, 2:5], k[:, :, :5], v[:, :, :5], encoding=scheme, causal=True)
    torch.testing.assert_close(chunk, full[:, :, 2:5], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_kv_cache_decoding_equals_the_full_causal_pass(name):
    """KVCache transforms each key once (the scheme's rotate) and keeps its position."""
    scheme = make(name)
    q, k, v = qkv(q_len=7, k_len=7, kv_heads=2)
    full = attention(q, k, v, encoding=scheme, causal=True)
    cache = posenc.KVCache(scheme, capacity=2)  # capacity 2: storage grows on the way
    outs = []
    for a, b in ((0, 3), (3, 4), (4, 6), (6, 7)):
        q_new, keys, _ = cache.update(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b])
        assert keys.shape[-2] == b
        outs.append(cache.attention(q_new))
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_kv_cache_left_padded_batch_equals_the_full_pass(name):
    """Per-sample positions and a padding mask through the cache, as in the full pass."""
    scheme = make(name)
    q, k, v = qkv(batch=2, q_len=6, k_len=6, kv_heads=2)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, :2] = False
    positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
    mask = keep[:, None, None, :]
    full = attention(q, k, v, encoding=scheme, causal=True, mask=mask, k_positions=positions)
    cache = posenc.KVCache(scheme)
    outs = []
    for a, b in ((0, 4), (4, 5), (5, 6)):
        q_new, _, _ = cache.update(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], positions[:, a:b])
        outs.append(cache.attention(q_new, mask=mask[..., :b]))
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_calling_a_scheme_is_its_eager_attention(name):
    scheme = make(name)
    q, k, v = qkv(q_len=4, k_len=6, kv_heads=2)
    want = attention(q, k, v, encoding=scheme, causal=True, backend="eager")
    torch.testing.assert_close(scheme(q, k, v, causal=True), want, rtol=0, atol=0)


# --- transforms, tracing and devices ---------------------------------------------------------


class _Attend(torch.nn.Module):
    """attention() as a module, with the scheme as a submodule (its parameters are inputs)."""

    def __init__(self, scheme):
        super().__init__()
        self.scheme = scheme

    def forward(self, q, k, v, keep, positions):
        return attention(
            q, k, v, encoding=self.scheme, mask=keep, causal=True, k_positions=positions
        )


def _traced_inputs():
    q, k, v = qkv(batch=2, q_len=4, k_len=4, kv_heads=2, dtype=torch.float32)
    keep = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    keep[1, ..., 0] = False
    positions = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 2]])
    return q, k, v, keep, positions


@pytest.mark.parametrize("name", ALL)
def test_compiles_with_no_graph_break(name):
    """fullgraph=True raises on any graph break; the eager backend keeps this test cheap."""
    scheme = make(name, dtype=torch.float32)
    module = _Attend(scheme)
    inputs = _traced_inputs()
    torch._dynamo.reset()
    try:
        compiled = torch.compile(module, fullgraph=True, backend="eager")
        got = compiled(*inputs)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, module(*inputs), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_exports(name):
    scheme = make(name, dtype=torch.float32)
    module = _Attend(scheme)
    inputs = _traced_inputs()
    for strict in (False, True):
        exported = torch.export.export(module, inputs, strict=strict)
        got = exported.module()(*inputs)
        torch.testing.assert_close(got, module(*inputs), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_vmap_over_the_batch(name):
    scheme = make(name)
    q, k, v = qkv(batch=3, q_len=4, k_len=4, kv_heads=2)
    want = attention(q, k, v, encoding=scheme, causal=True)
    got = torch.vmap(lambda q, k, v: attention(q, k, v, encoding=scheme, causal=True))(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("check", [torch.autograd.gradcheck, torch.autograd.gradgradcheck])
@pytest.mark.parametrize("name", ALL)
def test_first_and_second_derivatives(name, check):
    """gradcheck, and gradgradcheck for Hessians: float64 autograd avoids the fused CPU
    kernel, whose backward has no derivative."""
    scheme = make(name)
    q, k, v = qkv(batch=1, q_len=3, k_len=4, kv_heads=2)
    keep = torch.ones(1, 1, 3, 4, dtype=torch.bool)
    keep[0, 0, 1, 0] = False
    inputs = tuple(t.clone().requires_grad_() for t in (q, k, v))

    def f(q, k, v):
        return attention(q, k, v, encoding=scheme, mask=keep, causal=True)

    # fast mode: checks random projections of the Jacobian, cheap enough for every scheme
    assert check(f, inputs, fast_mode=True)


@pytest.mark.parametrize("name", ALL)
def test_meta_tensors(name):
    scheme = make(name, dtype=torch.float32, device="meta")
    q, k, v = (t.to("meta") for t in qkv(kv_heads=2, dtype=torch.float32))
    keep = torch.ones(2, 1, 1, 5, dtype=torch.bool, device="meta")
    positions = torch.zeros(2, 5, dtype=torch.long, device="meta")
    out = attention(q, k, v, encoding=scheme, mask=keep, causal=True, k_positions=positions)
    assert out.device.type == "meta" and out.shape == q.shape and out.dtype == q.dtype
    w = attention_weights(q, k, encoding=scheme, mask=keep, causal=True)
    assert w.device.type == "meta" and w.shape == (2, HEADS, 5, 5)


# bf16 keeps 8 significant bits: an output in [2, 4) is rounded to a multiple of 2**-6, and
# on the SDPA path the logits and the bias reach the softmax in bf16 too.  Measured against
# float64 on the same bf16 inputs, every scheme stays below 0.01 (5 seeds); 0.03 leaves a
# margin of 3x, while a mask or bias applied wrongly moves outputs by 0.1 or more.
BF16_TOLERANCE = 0.03


@pytest.mark.parametrize("name", ALL)
def test_bf16_close_to_float64(name):
    scheme = make(name)  # float64 parameters: the bf16 run casts what it needs
    q, k, v = (t.to(torch.bfloat16) for t in qkv(q_len=6, k_len=6, kv_heads=2))
    keep = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    keep[1, ..., :2] = False
    got = attention(q, k, v, encoding=scheme, mask=keep, causal=True)
    assert got.dtype == torch.bfloat16
    want = attention(q.double(), k.double(), v.double(), encoding=scheme, mask=keep, causal=True)
    err = (got.double() - want).abs().max().item()
    assert err < BF16_TOLERANCE, err


@pytest.mark.parametrize("name", ALL)
def test_flex_backend_equals_eager_or_refuses(name):
    """backend="flex" (compiled FlexAttention, posenc.flex) equals the eager path, or refuses.

    Schemes it cannot express exactly (content-dependent biases, custom ``attend``)
    raise ``ValueError``; ``backend="auto"`` never picks it for them.
    """
    if not posenc.flex_available("cpu"):
        pytest.skip("FlexAttention cannot be compiled here")
    scheme = make(name, dtype=torch.float32)
    q, k, v, keep, positions = _traced_inputs()
    kwargs = dict(mask=keep, causal=True, k_positions=positions)
    # a subclass inherits its parent's paths, and errors name the subclass
    sub = type(f"Sub{type(scheme).__name__}", (type(scheme),), {})
    inherited = sub.__new__(sub)
    inherited.__dict__.update(scheme.__dict__)
    for s in (scheme, inherited):
        if not posenc.supports_flex(s):
            with pytest.raises(ValueError, match=f"cannot express encoding {type(s).__name__}:"):
                attention(q, k, v, backend="flex", encoding=s, **kwargs)
            continue
        with torch.no_grad():
            got = attention(q, k, v, backend="flex", encoding=s, **kwargs)
            want = attention(q, k, v, backend="eager", encoding=s, **kwargs)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
