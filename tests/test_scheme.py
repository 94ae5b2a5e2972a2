"""Tests for posenc.scheme: posenc.attention, the one entry point every scheme goes through.

Golden values come from an explicit float64 softmax loop over (i, j) written
here, independent of PyTorch's SDPA kernels.
"""

import importlib
import itertools
import math

import pytest
import torch

import posenc
from posenc import PositionalScheme, attention, attention_weights, causal_mask

# the module, not the function of the same name that `posenc` re-exports
attention_module = importlib.import_module("posenc.attend")
sdpa_module = importlib.import_module("posenc.sdpa")


def reference_attention(q, k, v, *, bias=None, causal=False, q_offset=None, scale=None):
    """softmax(scale * q k^T + bias) v with explicit loops over i and j, in float64."""
    q, k, v = q.double(), k.double(), v.double()
    q_len, k_len, d = q.shape[-2], k.shape[-2], q.shape[-1]
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if bias is not None:
        lead = torch.broadcast_shapes(lead, bias.shape[:-2])
        bias = bias.double().expand(*lead, q_len, k_len)
    q = q.expand(*lead, q_len, d)
    k = k.expand(*lead, k_len, d)
    v = v.expand(*lead, k_len, v.shape[-1])
    offset = k_len - q_len if q_offset is None else q_offset
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(*lead, q_len, v.shape[-1], dtype=torch.float64)
    for idx in itertools.product(*[range(n) for n in lead]):
        for i in range(q_len):
            scores = []
            for j in range(k_len):
                s = scale * float(torch.dot(q[idx][i], k[idx][j]))
                if bias is not None:
                    s += float(bias[idx][i, j])
                if causal and j > offset + i:
                    s = -math.inf
                scores.append(s)
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            for j in range(k_len):
                out[idx][i] += weights[j] / total * v[idx][j]
    return out


def rand(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype)


# --- against the explicit loop ---------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("q_len", "k_len"), [(5, 5), (3, 7), (1, 6)])
def test_matches_explicit_loop(causal, q_len, k_len):
    q, k, v = rand(2, 3, q_len, 4), rand(2, 3, k_len, 4), rand(2, 3, k_len, 5)
    got = attention(q, k, v, causal=causal)
    want = reference_attention(q, k, v, causal=causal)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("q_offset", [0, 1, 2, 4, 9])
def test_causal_explicit_offset(q_offset):
    q, k, v = rand(2, 3, 4), rand(2, 7, 4), rand(2, 7, 3)
    got = attention(q, k, v, causal=True, q_offset=q_offset)
    want = reference_attention(q, k, v, causal=True, q_offset=q_offset)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_non_causal_ignores_offset():
    q, k, v = rand(3, 4), rand(6, 4), rand(6, 2)
    torch.testing.assert_close(attention(q, k, v, q_offset=-5), attention(q, k, v))


def test_scale_is_used():
    q, k, v = rand(3, 4), rand(5, 4), rand(5, 2)
    got = attention(q, k, v, scale=0.7)
    torch.testing.assert_close(got, reference_attention(q, k, v, scale=0.7), rtol=0, atol=1e-12)


def test_kv_cache_decoding_equals_last_row_of_full_causal():
    """One query at the end of the cache sees what the last row of full attention sees."""
    q, k, v = rand(2, 8, 4), rand(2, 8, 4), rand(2, 8, 3)
    full = attention(q, k, v, causal=True)
    for t in range(1, 9):  # decode step t: cache holds keys 0..t-1, the query is token t-1
        step = attention(q[:, t - 1 : t], k[:, :t], v[:, :t], causal=True)
        torch.testing.assert_close(step, full[:, t - 1 : t], rtol=1e-12, atol=1e-12)
    # several new queries at once (chunked prefill), offset given explicitly
    chunk = attention(q[:, 5:], k, v, causal=True, q_offset=5)
    torch.testing.assert_close(chunk, full[:, 5:], rtol=1e-12, atol=1e-12)


# --- bias --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bias_shape", [(5, 7), (1, 7), (5, 1), (1, 3, 5, 7), (1, 1, 5, 7), (2, 3, 5, 7), (2, 1, 1, 7)]
)
@pytest.mark.parametrize("causal", [False, True])
def test_bias_broadcasts(bias_shape, causal):
    q, k, v = rand(2, 3, 5, 4), rand(2, 3, 7, 4), rand(2, 3, 7, 2)
    bias = rand(*bias_shape)
    got = attention(q, k, v, bias=bias, causal=causal)
    want = reference_attention(q, k, v, bias=bias, causal=causal)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_minus_inf_bias_masks_keys():
    q, k, v = rand(4, 3), rand(6, 3), rand(6, 2)
    bias = torch.zeros(4, 6, dtype=torch.float64)
    bias[:, 2] = -math.inf
    w = attention_weights(q, k, bias=bias)
    assert torch.all(w[:, 2] == 0)
    # equals attention over the keys that are left
    keep = [0, 1, 3, 4, 5]
    torch.testing.assert_close(
        attention(q, k, v, bias=bias), attention(q, k[keep], v[keep]), rtol=1e-12, atol=1e-12
    )


def test_bool_bias_is_a_keep_mask_and_combines_with_causal():
    q, k, v = rand(3, 4), rand(6, 4), rand(6, 2)
    keep = torch.rand(3, 6) > 0.3
    keep[:, 0] = True  # every row keeps at least one key
    additive = torch.zeros(3, 6, dtype=torch.float64).masked_fill(~keep, -math.inf)
    for causal, q_offset in [(False, None), (True, 1), (True, 0), (True, None)]:
        got = attention(q, k, v, bias=keep, causal=causal, q_offset=q_offset)
        want = reference_attention(q, k, v, bias=additive, causal=causal, q_offset=q_offset)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_bias_in_other_dtype_is_cast_to_q_dtype():
    q, k, v = rand(3, 4, dtype=torch.float32), rand(5, 4, dtype=torch.float32), rand(5, 2)
    v = v.float()
    bias = rand(3, 5)
    got = attention(q, k, v, bias=bias, causal=True)
    assert got.dtype == torch.float32
    want = reference_attention(q, k, v, bias=bias, causal=True)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


# --- the causal mask ---------------------------------------------------------------------------


@pytest.mark.parametrize(("q_len", "k_len", "q_offset"), [(4, 4, None), (2, 7, None), (3, 5, 0)])
def test_causal_mask_formula(q_len, k_len, q_offset):
    mask = causal_mask(q_len, k_len, q_offset)
    offset = k_len - q_len if q_offset is None else q_offset
    assert mask.shape == (q_len, k_len) and mask.dtype == torch.bool
    for i in range(q_len):
        for j in range(k_len):
            assert bool(mask[i, j]) == (j <= offset + i)


@pytest.mark.parametrize("q_len", [1, 3, 6])
@pytest.mark.parametrize("k_len", [6, 9])
@pytest.mark.parametrize("q_offset", [None, 0, 2, 20])
def test_no_fully_masked_row(q_len, k_len, q_offset):
    """Key 0 is visible to every query whenever the offset is legal, so no row is empty."""
    assert causal_mask(q_len, k_len, q_offset).any(dim=-1).all()
    q, k, v = rand(q_len, 4), rand(k_len, 4), rand(k_len, 2)
    assert torch.isfinite(attention(q, k, v, causal=True, q_offset=q_offset)).all()


def test_negative_offset_with_causal_is_rejected():
    """A negative offset would leave the first query with no key at all."""
    with pytest.raises(ValueError, match="q_offset"):
        causal_mask(3, 5, -1)
    with pytest.raises(ValueError, match="q_offset"):
        attention(rand(3, 4), rand(5, 4), rand(5, 2), causal=True, q_offset=-1)


# --- fast paths --------------------------------------------------------------------------------


class _Spy:
    """Record what reaches torch's SDPA, then call it."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = sdpa_module.F.scaled_dot_product_attention

        def spy(q, k, v, attn_mask=None, is_causal=False, scale=None, **kw):
            self.calls.append((attn_mask, is_causal))
            return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, **kw)

        monkeypatch.setattr(sdpa_module.F, "scaled_dot_product_attention", spy)


def test_fast_path_is_causal_with_zero_offset(monkeypatch):
    q, k, v = rand(2, 6, 4), rand(2, 6, 4), rand(2, 6, 3)
    explicit = attention(q, k, v, bias=torch.zeros(6, 6, dtype=torch.float64), causal=True)
    spy = _Spy(monkeypatch)
    fast = attention(q, k, v, causal=True)
    assert spy.calls == [(None, True)]  # no mask tensor was built
    torch.testing.assert_close(fast, explicit, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fast, reference_attention(q, k, v, causal=True), rtol=0, atol=1e-12)


@pytest.mark.parametrize("q_offset", [None, 5, 8])
def test_fast_path_no_mask_when_every_key_is_visible(monkeypatch, q_offset):
    q, k, v = rand(1, 4), rand(6, 4), rand(6, 3)
    explicit = attention(q, k, v, bias=torch.zeros(1, 6, dtype=torch.float64), causal=False)
    spy = _Spy(monkeypatch)
    fast = attention(q, k, v, causal=True, q_offset=q_offset)
    assert spy.calls == [(None, False)]
    torch.testing.assert_close(fast, explicit, rtol=1e-12, atol=1e-12)
    want = reference_attention(q, k, v, causal=True, q_offset=5 if q_offset is None else q_offset)
    torch.testing.assert_close(fast, want, rtol=0, atol=1e-12)


def test_explicit_mask_when_needed(monkeypatch):
    spy = _Spy(monkeypatch)
    attention(rand(3, 4), rand(6, 4), rand(6, 3), causal=True)
    ((mask, is_causal),) = spy.calls
    assert not is_causal and mask.shape == (1, 1, 3, 6) and mask.dtype == torch.bool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "bias_shape", [(5, 7), (2, 1, 5, 7), (1, 3, 1, 7), (2, 3, 5, 7)], ids=lambda s: str(s)
)
def test_sdpa_gets_a_contiguous_4d_mask_in_q_dtype(monkeypatch, dtype, bias_shape):
    """A 3-D or strided mask sends SDPA to its slow math kernel (issue 14): 4-D, contiguous."""
    q = torch.randn(2, 3, 5, 4, dtype=dtype)
    k, v = torch.randn(2, 3, 7, 4, dtype=dtype), torch.randn(2, 3, 7, 4, dtype=dtype)
    bias = torch.randn(*bias_shape, dtype=torch.float64).expand(2, 3, 5, 7)  # strided view
    spy = _Spy(monkeypatch)
    attention(q, k, v, bias=bias, causal=True)
    attention(q, k, v, encoding=posenc.ALiBi(3), causal=True)
    for mask, is_causal in spy.calls:
        assert mask.dim() == 4 and mask.is_contiguous() and mask.dtype == dtype
        assert not is_causal


def test_boolean_masks_stay_boolean(monkeypatch):
    q, k, v = rand(2, 3, 5, 4), rand(2, 3, 7, 4), rand(2, 3, 7, 4)
    keep = torch.rand(2, 1, 1, 7) > 0.3
    keep[..., -1] = True
    spy = _Spy(monkeypatch)
    attention(q, k, v, mask=keep, causal=True)
    ((mask, _),) = spy.calls
    assert mask.dtype == torch.bool and mask.shape == (2, 1, 5, 7) and mask.is_contiguous()


# --- weights, dtype, device --------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_attention_weights_rows_sum_to_one(causal):
    q, k = rand(2, 3, 5, 4), rand(2, 3, 8, 4)
    w = attention_weights(q, k, causal=causal, bias=rand(5, 8))
    assert w.shape == (2, 3, 5, 8)
    assert torch.all(w >= 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5, dtype=torch.float64))
    if causal:
        assert torch.all(w[..., ~causal_mask(5, 8)] == 0)


def test_attention_weights_match_loop_softmax():
    q, k = rand(3, 4), rand(5, 4)
    w = attention_weights(q, k)
    for i in range(3):
        s = [float(q[i] @ k[j]) / 2.0 for j in range(5)]
        z = sum(math.exp(x) for x in s)
        for j in range(5):
            assert abs(float(w[i, j]) - math.exp(s[j]) / z) < 1e-12


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_output_dtype_and_device(device, dtype, causal):
    q = torch.randn(2, 3, 4, dtype=dtype, device=device)
    k = torch.randn(2, 6, 4, dtype=dtype, device=device)
    v = torch.randn(2, 6, 5, dtype=dtype, device=device)
    out = attention(q, k, v, causal=causal, bias=torch.zeros(3, 6, device=device))
    assert out.shape == (2, 3, 5) and out.dtype == dtype and out.device == q.device
    want = reference_attention(q.cpu(), k.cpu(), v.cpu(), causal=causal)
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(out.double().cpu(), want, rtol=tol, atol=tol)


# --- validation --------------------------------------------------------------------------------


def _qkv():
    return rand(3, 4), rand(5, 4), rand(5, 2)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda q, k, v: ([1.0], k, v, {}), TypeError, "q must be a torch.Tensor"),
        (lambda q, k, v: (q.long(), k, v, {}), TypeError, "q must be a floating-point"),
        (lambda q, k, v: (q, k.long(), v, {}), TypeError, "k must be a floating-point"),
        (lambda q, k, v: (q, k, v.long(), {}), TypeError, "v must be a floating-point"),
        (lambda q, k, v: (q[0], k, v, {}), ValueError, "q must have at least 2 dimensions"),
        (lambda q, k, v: (q.float(), k, v, {}), TypeError, "q, k and v must share a dtype"),
        (lambda q, k, v: (q, k.to("meta"), v, {}), ValueError, "q, k and v must be on one device"),
        (lambda q, k, v: (q, k[:, :3], v, {}), ValueError, "q and k must share their last"),
        (lambda q, k, v: (q, k, v[:4], {}), ValueError, "k and v must have the same length"),
        (lambda q, k, v: (q, k[None], v, {}), ValueError, "same number of dimensions"),
        (lambda q, k, v: (q[:0], k, v, {}), ValueError, "q_len and k_len must be positive"),
        (lambda q, k, v: (q, k[:0], v[:0], {}), ValueError, "q_len and k_len must be positive"),
        (lambda q, k, v: (q, k, v, {"causal": 1}), TypeError, "causal must be a bool"),
        (lambda q, k, v: (q, k, v, {"bias": [0.0]}), TypeError, "bias must be a torch.Tensor"),
        (lambda q, k, v: (q, k, v, {"bias": rand(3, 4)}), ValueError, "bias must have shape"),
        (lambda q, k, v: (q, k, v, {"bias": rand(5)}), ValueError, "bias must have shape"),
        (lambda q, k, v: (q, k, v, {"mask": rand(2, 3, 5)}), ValueError, "mask must have shape"),
        (lambda q, k, v: (q, k, v, {"mask": [True]}), TypeError, "mask must be a torch.Tensor"),
        (
            lambda q, k, v: (q, k, v, {"mask": torch.ones(3, 5, dtype=torch.long)}),
            TypeError,
            r"mask must be a boolean keep-mask .* got dtype torch.int64",
        ),
        (
            lambda q, k, v: (q, k, v, {"bias": torch.ones(3, 5, dtype=torch.int32)}),
            TypeError,
            r"bias must be a boolean keep-mask .* got dtype torch.int32",
        ),
        (
            lambda q, k, v: (q, k, v, {"q_offset": 10**13}),
            ValueError,
            r"q_offset must keep every query position .* within 2\*\*31",
        ),
        (
            lambda q, k, v: (q, k, v, {"q_offset": -(2**31)}),
            ValueError,
            r"q_offset must keep every query position",
        ),
        (
            lambda q, k, v: (q[None], k[None], v[None], {"q_positions": torch.zeros(1, 3)}),
            TypeError,
            "q_positions must hold integers",
        ),
        (
            lambda q, k, v: (q, k, v, {"k_positions": torch.arange(5) + (2**63 - 6)}),
            ValueError,
            r"k_positions must lie strictly within 2\*\*31",
        ),
        (
            lambda q, k, v: (q, k, v, {"q_positions": torch.tensor([0, 1, -(2**63)])}),
            ValueError,
            r"q_positions must lie strictly within 2\*\*31",
        ),
        (
            lambda q, k, v: (q, k, v, {"q_positions": torch.arange(4)}),
            ValueError,
            r"q_positions must have shape \(q_len,\) = \(3,\)",
        ),
        (
            lambda q, k, v: (q, k, v, {"k_positions": torch.zeros(1, 1, 5, dtype=torch.long)}),
            ValueError,
            r"k_positions must have shape \(k_len,\) = \(5,\) or \(batch, k_len\)",
        ),
        (
            lambda q, k, v: (q, k, v, {"k_positions": torch.zeros(1, 5, dtype=torch.long)}),
            ValueError,
            r"k_positions of shape \(batch, k_len\) needs q, k and v of shape \(batch, heads",
        ),
        (
            lambda q, k, v: (q, k, v, {"k_positions": torch.arange(5), "q_offset": 3}),
            ValueError,
            "q_positions must be given when the queries are not among the keys",
        ),
        (lambda q, k, v: (q, k, v, {"q_offset": 1.5}), TypeError, "q_offset must be an integer"),
        (lambda q, k, v: (q, k, v, {"scale": 0.0}), ValueError, "scale must be > 0"),
        (lambda q, k, v: (q, k, v, {"scale": math.nan}), ValueError, "scale must be finite"),
        (lambda q, k, v: (q, k, v, {"scale": "1"}), TypeError, "scale must be a real number"),
        (lambda q, k, v: (q, k, v, {"encoding": "rope"}), TypeError, "encoding must be a posenc"),
        (
            lambda q, k, v: (rand(6, 4), k, v, {"causal": True}),
            ValueError,
            "causal mask needs q_len <= k_len",
        ),
    ],
)
def test_validation_errors_name_the_parameter(change, error, match):
    q, k, v, kwargs = change(*_qkv())
    with pytest.raises(error, match=match):
        attention(q, k, v, **kwargs)


def test_causal_mask_validation():
    with pytest.raises(ValueError, match="q_len must be a positive integer"):
        causal_mask(0, 4)
    with pytest.raises(ValueError, match="k_len must be a positive integer"):
        causal_mask(2, 0)
    with pytest.raises(TypeError, match="q_len must be an integer"):
        causal_mask(2.0, 4)
    with pytest.raises(ValueError, match="causal mask needs q_len <= k_len"):
        causal_mask(5, 4)


# --- masks ----------------------------------------------------------------------------------


def test_mask_and_bias_combine():
    """A keep-mask, an additive mask and an additive bias all apply, in any combination."""
    q, k, v = rand(2, 3, 4, 5), rand(2, 3, 6, 5), rand(2, 3, 6, 2)
    keep = torch.rand(2, 1, 4, 6) > 0.3
    keep[..., 0] = True
    additive = rand(1, 3, 1, 6)
    bias = rand(4, 6)
    as_float = torch.zeros(2, 1, 4, 6, dtype=torch.float64).masked_fill(~keep, -math.inf)
    want = reference_attention(q, k, v, bias=as_float + additive + bias, causal=True)
    for mask, extra in [(keep, additive + bias), (as_float + additive, bias)]:
        got = attention(q, k, v, mask=mask, bias=extra, causal=True)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got = attention(q, k, v, mask=additive + bias, bias=keep, causal=True)  # bool bias: keep-mask
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_three_d_mask_is_ambiguous_with_four_d_q():
    q, k, v = rand(2, 3, 4, 5), rand(2, 3, 6, 5), rand(2, 3, 6, 2)
    for name in ("mask", "bias"):
        with pytest.raises(ValueError, match=rf"A 3-D {name} is ambiguous .*{name}\[:, None\]"):
            attention(q, k, v, **{name: torch.ones(2, 4, 6, dtype=torch.bool)})
    # with 3-D q, (heads, q_len, k_len) is the only reading, and it is accepted
    bias = rand(3, 4, 6)
    got = attention(q[0], k[0], v[0], bias=bias)
    torch.testing.assert_close(got, reference_attention(q[0], k[0], v[0], bias=bias))


@pytest.mark.parametrize("form", ["bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
def test_query_that_sees_no_key_gets_zeros(form, causal):
    """A fully masked row: zero weights, zero output, finite gradients; other rows unchanged."""
    q = rand(2, 3, 4, 5).requires_grad_()
    k, v = rand(2, 3, 6, 5), rand(2, 3, 6, 2)
    keep = torch.ones(2, 1, 4, 6, dtype=torch.bool)
    keep[1, 0, 2] = False  # query 2 of batch item 1 sees nothing
    mask = keep if form == "bool" else torch.zeros(keep.shape).masked_fill(~keep, -math.inf)
    out = attention(q, k, v, mask=mask, causal=causal)
    assert torch.all(out[1, :, 2] == 0) and torch.isfinite(out).all()
    plain = attention(q, k, v, causal=causal)
    rows = torch.ones(2, 4, dtype=torch.bool)
    rows[1, 2] = False
    torch.testing.assert_close(out.transpose(1, 2)[rows], plain.transpose(1, 2)[rows])
    w = attention_weights(q, k, mask=mask, causal=causal)
    assert torch.all(w[1, :, 2] == 0)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
    assert torch.all(q.grad[1, :, 2] == 0)


# --- grouped-query heads and per-sample positions -------------------------------------------


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_grouped_query_equals_repeated_heads(kv_heads):
    q, k, v = rand(2, 4, 5, 3), rand(2, kv_heads, 7, 3), rand(2, kv_heads, 7, 2)
    keep = torch.rand(2, 1, 1, 7) > 0.2
    got = attention(q, k, v, mask=keep, causal=True)
    rep = 4 // kv_heads
    k_rep, v_rep = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    want = reference_attention(
        q, k_rep, v_rep, bias=torch.zeros(keep.shape).masked_fill(~keep, -math.inf), causal=True
    )
    want = torch.where(keep.any(-1, keepdim=True), want, 0.0)  # rows with no key: zeros
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    w = attention_weights(q, k, mask=keep, causal=True)
    torch.testing.assert_close(w, attention_weights(q, k_rep, mask=keep, causal=True))


@pytest.mark.parametrize(
    ("q_shape", "kv_shape", "match"),
    [
        ((2, 4, 5, 3), (2, 3, 7, 3), "k and v must have a number of heads that divides q's"),
        ((2, 4, 5, 3), (3, 4, 7, 3), "q, k and v must have the same batch dimensions"),
        ((2, 2, 4, 5, 3), (2, 3, 4, 7, 3), "q, k and v must have the same batch dimensions"),
    ],
)
def test_head_and_batch_mismatches_are_named(q_shape, kv_shape, match):
    q, k, v = rand(*q_shape), rand(*kv_shape), rand(*kv_shape)
    with pytest.raises(ValueError, match=match):
        attention(q, k, v)
    with pytest.raises(ValueError, match="k and v must have the same number of heads"):
        attention(rand(2, 4, 5, 3), rand(2, 2, 7, 3), rand(2, 1, 7, 3))


def test_extra_batch_dimensions_are_merged_and_restored():
    q, k, v = rand(2, 3, 4, 5, 6), rand(2, 3, 2, 7, 6), rand(2, 3, 2, 7, 2)
    mask = torch.rand(2, 1, 1, 5, 7) > 0.2
    mask[..., 0] = True
    got = attention(q, k, v, mask=mask, causal=True)
    assert got.shape == (2, 3, 4, 5, 2)
    flat = attention(
        q.reshape(6, 4, 5, 6),
        k.reshape(6, 2, 7, 6),
        v.reshape(6, 2, 7, 2),
        mask=mask.expand(2, 3, 1, 5, 7).reshape(6, 1, 5, 7),
        causal=True,
    )
    torch.testing.assert_close(got.reshape(6, 4, 5, 2), flat)


class _Recorder(PositionalScheme):
    """Records the positions and shapes the hooks receive."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def rotate(self, q, k, ctx):
        self.seen.append((q.shape, k.shape, ctx.q_positions, ctx.k_positions))
        return q, k


def test_hooks_receive_four_d_tensors_and_int64_positions():
    rec = _Recorder()
    q, k, v = rand(2, 4, 3, 5), rand(2, 2, 6, 5), rand(2, 2, 6, 1)
    pos = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]], dtype=torch.int32)
    attention(q, k, v, encoding=rec, k_positions=pos)
    attention(q[0, 0], k[0, 0], v[0, 0], encoding=rec)
    attention(q, k, v, encoding=rec, q_positions=torch.arange(3), k_positions=pos)
    (qs, ks, qp, kp), (qs2, ks2, qp2, kp2), (_, _, qp3, kp3) = rec.seen
    assert qs == (2, 4, 3, 5) and ks == (2, 2, 6, 5) and qs2 == (1, 1, 3, 5) and ks2 == (1, 1, 6, 5)
    for t in (qp, kp, qp2, kp2, qp3, kp3):
        assert t.dtype == torch.int64
    assert torch.equal(kp, pos.long()) and torch.equal(qp, pos[:, 3:].long())  # the last keys
    assert torch.equal(qp2, torch.tensor([3, 4, 5])) and torch.equal(kp2, torch.arange(6))
    assert qp3.shape == (2, 3) and torch.equal(qp3[1], torch.arange(3))  # expanded per sample


def test_positions_do_not_move_the_causal_mask():
    """Causal masking is by index: positions change what schemes see, not who sees whom."""
    q, k = rand(1, 1, 4, 3), rand(1, 1, 4, 3)
    pos = torch.tensor([[7, 3, 9, 0]])
    alibi = posenc.ALiBi(1)
    w = attention_weights(q, k, encoding=alibi, causal=True, k_positions=pos)
    above = torch.ones(4, 4, dtype=torch.bool).triu(1)
    assert torch.all(w[..., above] == 0) and torch.all(w[..., ~above] > 0)
    # and the positions did reach the scheme: key 2 sits at 9, far from query 1 at 3
    plain = attention_weights(q, k, encoding=alibi, causal=True)
    assert (w - plain).abs().max() > 1e-3


def test_no_public_name_collides_with_a_submodule():
    """``posenc.attention`` is the function; no module of that name can shadow or be shadowed."""
    import pkgutil
    import types

    modules = {m.name for m in pkgutil.iter_modules(posenc.__path__)}
    assert "attend" in modules and "attention" not in modules
    for name in modules:
        value = vars(posenc).get(name)
        assert value is None or isinstance(value, types.ModuleType), name
    assert attention_module.attention is posenc.attention


def test_second_derivatives_in_float32_under_the_math_kernel():
    """What the README advises for Hessians below float64: SDPA's math kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (rand(1, 2, 4, 8, dtype=torch.float32).requires_grad_() for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        out = attention(q, k, v, encoding=posenc.RotaryEmbedding(8), causal=True)
        (g,) = torch.autograd.grad(out.pow(2).sum(), q, create_graph=True)
        (h,) = torch.autograd.grad(g.sum(), q)
    assert torch.isfinite(h).all() and h.abs().max() > 0


MOVED = {
    "attention": "attend",
    "attention_weights": "attend",
    "causal_mask": "masks",
    "merge_masks": "masks",
    "scaled_dot_product": "sdpa",
    "softmax_weights": "sdpa",
    "dot_scores": "sdpa",
    "repeat_kv": "sdpa",
}


@pytest.mark.parametrize("name", sorted(MOVED))
def test_names_moved_out_of_posenc_scheme_warn_and_are_the_new_ones(name):
    import posenc.scheme

    with pytest.warns(
        DeprecationWarning, match=rf"posenc\.scheme\.{name} is deprecated.*posenc\.{name}"
    ):
        old = getattr(posenc.scheme, name)
    assert old is getattr(posenc, name)
    assert old is getattr(importlib.import_module(f"posenc.{MOVED[name]}"), name)


def test_from_import_of_a_moved_name_warns_at_the_import():
    with pytest.warns(DeprecationWarning, match="posenc.scheme.attention") as w:
        from posenc.scheme import attention
    assert attention is posenc.attention
    assert w[0].filename == __file__


def test_posenc_scheme_has_no_other_attributes():
    import posenc.scheme

    with pytest.raises(AttributeError, match="has no attribute 'attend'"):
        posenc.scheme.attend  # noqa: B018
