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
attention_module = importlib.import_module("posenc.scheme")


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
    "bias_shape", [(5, 7), (1, 7), (5, 1), (3, 5, 7), (1, 5, 7), (2, 3, 5, 7), (2, 1, 5, 7)]
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
        real = attention_module.F.scaled_dot_product_attention

        def spy(q, k, v, attn_mask=None, is_causal=False, scale=None, **kw):
            self.calls.append((attn_mask, is_causal))
            return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, **kw)

        monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)


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
    assert not is_causal and mask.shape == (3, 6)


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
        (lambda q, k, v: (q[:0], k, v, {}), ValueError, "q_len and k_len must be positive"),
        (lambda q, k, v: (q, k[:0], v[:0], {}), ValueError, "q_len and k_len must be positive"),
        (lambda q, k, v: (q, k, v, {"causal": 1}), TypeError, "causal must be a bool"),
        (lambda q, k, v: (q, k, v, {"bias": [0.0]}), TypeError, "bias must be a torch.Tensor"),
        (lambda q, k, v: (q, k, v, {"bias": rand(3, 4)}), ValueError, "bias must broadcast"),
        (lambda q, k, v: (q, k, v, {"bias": rand(5)}), ValueError, "bias must broadcast"),
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


# --- every scheme through the one entry point -----------------------------------------------


class _AddOne(PositionalScheme):
    """A toy bias scheme: +1 on the diagonal of relative position 0."""

    materializes_bias = True

    def bias(self, q, k, q_positions, k_positions, scale):
        return (k_positions[None, :] == q_positions[:, None]).to(q.dtype)


def test_custom_scheme_bias_hook_is_added_to_scaled_scores():
    q, k, v = rand(2, 3, 5), rand(2, 7, 5), rand(2, 7, 2)
    scheme = _AddOne()
    got = attention(q, k, v, encoding=scheme, causal=True)
    pos_q = torch.arange(3) + 4
    extra = (torch.arange(7)[None, :] == pos_q[:, None]).double()
    torch.testing.assert_close(
        got, reference_attention(q, k, v, bias=extra, causal=True), rtol=1e-12, atol=1e-12
    )


def _scheme(name, num_heads, head_dim):
    """Build each scheme of the package for ``num_heads`` heads of size ``head_dim``.

    A scheme whose module has not landed yet is reported as an expected failure
    (TODO), never skipped silently.
    """
    missing = {
        "RotaryEmbedding": "TODO: posenc.rope.RotaryEmbedding not implemented yet",
        "ALiBi": "TODO: posenc.alibi.ALiBi not implemented yet",
        "T5RelativeBias": "TODO: posenc.t5.T5RelativeBias not implemented yet",
        "ShawRelativeAttention": "TODO: posenc.shaw.ShawRelativeAttention not implemented yet",
        "TransformerXLScheme": "TODO: posenc.transformer_xl.TransformerXLScheme not implemented",
        "DAAttention": "TODO: posenc.da_transformer.DAAttention not implemented yet",
    }
    if name is None:
        return None
    if not hasattr(posenc, name):
        pytest.xfail(missing[name])
    cls = getattr(posenc, name)
    if name == "RotaryEmbedding":
        return cls(head_dim)
    if name == "ALiBi":
        return cls(num_heads)
    if name == "T5RelativeBias":
        return cls(num_heads).double()
    if name == "ShawRelativeAttention":
        return cls(head_dim, 3).double()
    if name == "TransformerXLScheme":
        return cls(num_heads, head_dim).double()
    # DAAttention: distinct per-head weights so the distance rescaling matters
    scheme = cls(num_heads).double()
    with torch.no_grad():
        scheme.w.copy_(torch.linspace(-0.5, 0.5, num_heads))
        scheme.v.copy_(torch.linspace(1.0, -1.0, num_heads))
    return scheme


ALL_SCHEMES = [
    None,
    "RotaryEmbedding",
    "ALiBi",
    "T5RelativeBias",
    "ShawRelativeAttention",
    "TransformerXLScheme",
    "DAAttention",
]


@pytest.mark.parametrize("name", ALL_SCHEMES)
@pytest.mark.parametrize("device", DEVICES)
def test_every_scheme_through_the_one_entry_point(name, device):
    """Each scheme runs causal or not, with a KV-cache offset, on any device.

    Causal attention must not look at future keys, and decoding one query at the
    end of the cache must equal the last row of full causal attention (every
    scheme here depends on positions only through ``key - query``, or not at all).
    """
    heads, n, d = 2, 7, 8
    scheme = _scheme(name, heads, d)
    if isinstance(scheme, torch.nn.Module):
        scheme = scheme.to(device)
    q, k, v = (torch.randn(3, heads, n, d, dtype=torch.float64, device=device) for _ in range(3))
    for causal in (False, True):
        out = attention(q, k, v, encoding=scheme, causal=causal)
        assert out.shape == (3, heads, n, d) and out.dtype == q.dtype and out.device == q.device
        assert torch.isfinite(out).all()
    full = attention(q, k, v, encoding=scheme, causal=True)
    # changing the future keys and values leaves earlier outputs alone
    k2, v2 = k.clone(), v.clone()
    k2[..., 4:, :] += 1.0
    v2[..., 4:, :] -= 2.0
    changed = attention(q, k2, v2, encoding=scheme, causal=True)
    torch.testing.assert_close(changed[..., :4, :], full[..., :4, :], rtol=1e-12, atol=1e-12)
    # one decoding step, default and explicit offset
    step = attention(q[..., -1:, :], k, v, encoding=scheme, causal=True)
    torch.testing.assert_close(step, full[..., -1:, :], rtol=1e-12, atol=1e-12)
    step = attention(q[..., 3:5, :], k[..., :5, :], v[..., :5, :], encoding=scheme, causal=True)
    torch.testing.assert_close(step, full[..., 3:5, :], rtol=1e-12, atol=1e-12)
    chunk = attention(q[..., 2:5, :], k, v, encoding=scheme, causal=True, q_offset=2)
    torch.testing.assert_close(chunk, full[..., 2:5, :], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", [None, "RotaryEmbedding"])
def test_schemes_without_bias_never_materialise_one(monkeypatch, name):
    """No encoding and RoPE reach SDPA with no (q_len, k_len) tensor when none is needed."""
    scheme = _scheme(name, 2, 8)
    assert not getattr(scheme, "materializes_bias", False)
    q, k, v = (torch.randn(2, 6, 8, dtype=torch.float64) for _ in range(3))
    spy = _Spy(monkeypatch)
    attention(q, k, v, encoding=scheme)
    attention(q, k, v, encoding=scheme, causal=True)
    attention(q[:, -1:], k, v, encoding=scheme, causal=True)
    assert spy.calls == [(None, False), (None, True), (None, False)]
