"""posenc.flex: compiled FlexAttention against the eager path and a float64 reference.

Each case runs ``attention(..., backend="flex")`` (compiled on the CPU, the same
code as the GPU's Triton kernels) and ``backend="eager"`` (SDPA with a dense bias)
in float32 and compares both with explicit float64 attention: scores, the scheme's
bias from its formula, masks, softmax, and zero rows for queries that see no key.

Compiling costs seconds per kernel (one per scheme, mask form and shape), so
the tests use few shapes (compiled kernels are shared across tests in the
process) and combine features in one call: causal + left padding + per-sample
positions + grouped-query heads for each scheme; a floating mask with ``-inf``
entries (ALiBi); decoding with ``q_offset`` (T5).  The mask that
the eager path hands to SDPA is checked here too: 4-D, contiguous, boolean or
floating, so that SDPA keeps its fused kernel.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

import posenc
from posenc import attention, flex

pytestmark = pytest.mark.skipif(
    not flex.flex_available("cpu"), reason="FlexAttention cannot be compiled here"
)

BATCH, HEADS, KV_HEADS, DIM, LEN = 2, 4, 2, 16, 160  # two blocks of 128, the last partial


def alibi():
    return posenc.ALiBi(HEADS)


def t5():
    m = posenc.T5RelativeBias(HEADS, num_buckets=8, max_distance=12)
    with torch.no_grad():
        m.weight.normal_()  # far from zero: every bucket matters
    return m


def _example(name):
    def make():
        torch.manual_seed(0)
        return posenc.SCHEMES[name].examples(HEADS, DIM)[""]

    return make


# every registered scheme that changes the scores through a score_mod
SCHEMES = {
    name: _example(name)
    for name, cls in posenc.SCHEMES.items()
    if cls.acts_on == "attention" and cls.fused() and cls.changes_scores()
}


def reference_bias(scheme, q_pos, k_pos):
    """The scheme's eager bias in float64, ``(batch, heads, q_len, k_len)``.

    Each scheme's test file checks that bias against its formula with explicit loops.
    """
    scheme = copy.deepcopy(scheme).double()
    q = torch.zeros(q_pos.shape[0], HEADS, q_pos.shape[1], DIM, dtype=torch.float64)
    k = torch.zeros(k_pos.shape[0], KV_HEADS, k_pos.shape[1], DIM, dtype=torch.float64)
    ctx = posenc.CallContext.of(q, k, q_positions=q_pos, k_positions=k_pos)
    with torch.no_grad():
        q, k = scheme.rotate(q, k, ctx)
        return scheme.bias(q, k, ctx).expand(q_pos.shape[0], HEADS, -1, -1)


def reference(scheme, q, k, v, *, keep, q_pos, k_pos, scale, additive=None):
    """Explicit float64 attention; ``keep`` includes the causal mask."""
    q, k, v = q.double(), k.double(), v.double()
    k = k.repeat_interleave(HEADS // k.shape[1], dim=1)
    v = v.repeat_interleave(HEADS // v.shape[1], dim=1)
    scores = scale * q @ k.transpose(-1, -2) + reference_bias(scheme, q_pos, k_pos)
    if additive is not None:
        scores = scores + additive.double()
    scores = scores.masked_fill(~keep, -math.inf)
    seen = keep.any(-1, keepdim=True)
    w = torch.softmax(scores.masked_fill(~seen, 0.0), -1)
    return torch.where(seen, w @ v, 0.0)


def qkv(q_len=LEN, k_len=LEN, kv_heads=KV_HEADS, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, HEADS, q_len, DIM, generator=g)
    k = torch.randn(BATCH, kv_heads, k_len, DIM, generator=g)
    v = torch.randn(BATCH, kv_heads, k_len, DIM, generator=g)
    return q, k, v


def left_padded(length, pads=(0, 37)):
    """Keep-mask ``(batch, length)`` and positions of a left-padded batch."""
    keep = torch.ones(len(pads), length, dtype=torch.bool)
    for b, pad in enumerate(pads):
        keep[b, :pad] = False
    positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
    return keep, positions


def both(scheme, q, k, v, **kwargs):
    with torch.no_grad():
        got = attention(q, k, v, encoding=scheme, backend="flex", **kwargs)
        eager = attention(q, k, v, encoding=scheme, backend="eager", **kwargs)
    return got, eager


def check(got, eager, want):
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)
    torch.testing.assert_close(eager.double(), want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("name", SCHEMES)
def test_causal_left_padded_grouped_query(name):
    """Causal mask, key padding, per-sample positions and kv_heads < heads in one call."""
    scheme = SCHEMES[name]()
    q, k, v = qkv()
    keep, pos = left_padded(LEN)
    got, eager = both(scheme, q, k, v, causal=True, mask=keep[:, None, None, :], k_positions=pos)
    causal = torch.ones(LEN, LEN, dtype=torch.bool).tril()
    full_keep = keep[:, None, None, :] & causal
    want = reference(scheme, q, k, v, keep=full_keep, q_pos=pos, k_pos=pos, scale=DIM**-0.5)
    check(got, eager, want)
    assert torch.all(got[1, :, :37] == 0)  # padded queries see no key: zero output


def test_float_mask_with_minus_inf_and_finite_terms():
    """A floating mask: ``-inf`` entries remove keys, finite ones add to the scores."""
    scheme = alibi()  # the mask is handled outside the scheme's score_mod
    q, k, v = qkv(kv_heads=HEADS, seed=1)
    g = torch.Generator().manual_seed(2)
    finite = torch.randn(1, HEADS, LEN, LEN, generator=g)
    keep = torch.rand(BATCH, 1, LEN, LEN, generator=g) > 0.2
    keep[0, :, 5] = False  # a query that sees nothing
    mask = finite.masked_fill(~keep, -math.inf)
    got, eager = both(scheme, q, k, v, mask=mask, scale=0.3)
    pos = torch.arange(LEN).expand(BATCH, LEN)
    want = reference(
        scheme, q, k, v, keep=keep.expand(BATCH, HEADS, LEN, LEN), q_pos=pos, k_pos=pos,
        scale=0.3, additive=finite,
    )  # fmt: skip
    check(got, eager, want)
    assert torch.all(got[0, :, 5] == 0)


def test_decoding_chunk_with_q_offset():
    """32 new queries after 128 cached keys: causal by index, ``k <= q_offset + q``."""
    scheme = t5()  # T5 is bidirectional here: the causal mask alone hides later keys
    q, k, v = qkv(q_len=32, seed=3)
    got, eager = both(scheme, q, k, v, causal=True)
    q_pos = (torch.arange(32) + LEN - 32).expand(BATCH, 32)
    k_pos = torch.arange(LEN).expand(BATCH, LEN)
    keep = (k_pos[:, None, None, :] <= q_pos[:, None, :, None]).expand(BATCH, HEADS, 32, LEN)
    want = reference(scheme, q, k, v, keep=keep, q_pos=q_pos, k_pos=k_pos, scale=DIM**-0.5)
    check(got, eager, want)


def test_auto_takes_flex_for_large_scores_only(monkeypatch):
    calls = []
    run = flex.run
    monkeypatch.setattr(flex, "run", lambda *a, **kw: calls.append(1) or run(*a, **kw))
    scheme = alibi()
    q, k, v = qkv()
    keep, pos = left_padded(LEN)
    kwargs = dict(encoding=scheme, causal=True, mask=keep[:, None, None, :], k_positions=pos)
    with torch.no_grad():
        attention(q, k, v, **kwargs)  # 160 * 160 scores per head: below the threshold
        assert calls == []
        monkeypatch.setattr(flex, "AUTO_MIN_SCORES", LEN * LEN)
        got = attention(q, k, v, **kwargs)
        assert calls == [1]
        eager = attention(q, k, v, backend="eager", **kwargs)
        torch.testing.assert_close(got, eager, rtol=0, atol=2e-5)
        # auto never takes flex for schemes that do not change the scores, nor with gradients
        attention(q, k, v, encoding=None, causal=True)
        assert calls == [1]
    q.requires_grad_(True)
    attention(q, k, v, **kwargs).sum().backward()
    assert calls == [1] and q.grad is not None


class ShiftedALiBi(posenc.ALiBi):
    """A custom scheme with its own score_mod: ALiBi plus a per-head constant."""

    def bias(self, q, k, ctx):
        return super().bias(q, k, ctx) + 0.5

    def score_mod(self, ctx):
        slopes = self.slopes.to(ctx.device, torch.float32)
        return lambda score, b, h, qp, kp: score - slopes[h] * (qp - kp).abs() + 0.5


class Steeper(posenc.ALiBi):
    """ALiBi with doubled slopes: both inherited paths read ``self.slopes``."""

    def __init__(self, num_heads):
        super().__init__(num_heads)
        self.slopes.mul_(2)


class BiasOnly(posenc.ALiBi):
    """Overrides bias but not score_mod: the inherited score_mod would be wrong."""

    def bias(self, q, k, ctx):
        return 2 * super().bias(q, k, ctx)


class EmptyT5(posenc.T5RelativeBias):
    pass


def test_custom_scheme_with_score_mod():
    scheme = ShiftedALiBi(HEADS)
    assert posenc.supports_flex(scheme)
    q, k, v = qkv()
    got, eager = both(scheme, q, k, v, causal=True)
    torch.testing.assert_close(got, eager, rtol=0, atol=2e-5)


def test_subclasses_keep_the_fused_path():
    """A subclass with other slopes, and an empty subclass, run fused and equal eager."""
    q, k, v = qkv()
    keep, pos = left_padded(LEN)
    steeper = Steeper(HEADS)
    got, eager = both(steeper, q, k, v, causal=True, mask=keep[:, None, None, :], k_positions=pos)
    causal = torch.ones(LEN, LEN, dtype=torch.bool).tril()
    want = reference(
        steeper, q, k, v, keep=keep[:, None, None, :] & causal, q_pos=pos, k_pos=pos,
        scale=DIM**-0.5,
    )  # fmt: skip
    check(got, eager, want)
    plain, _ = both(alibi(), q, k, v, causal=True)
    assert (both(steeper, q, k, v, causal=True)[0] - plain).abs().max() > 1e-2  # slopes used
    empty = EmptyT5(HEADS, num_buckets=8, max_distance=12)
    got, eager = both(empty, q, k, v, causal=True)
    torch.testing.assert_close(got, eager, rtol=0, atol=2e-5)


def test_a_subclass_that_overrides_bias_only_is_refused_by_name():
    scheme = BiasOnly(HEADS)
    assert not posenc.supports_flex(scheme)
    q, k, v = qkv(q_len=8, k_len=8)
    with torch.no_grad():
        with pytest.raises(ValueError, match="cannot express encoding BiasOnly: BiasOnly defines"):
            attention(q, k, v, encoding=scheme, backend="flex")
    assert repr(scheme) == "BiasOnly(num_heads=4)"


def test_refusals():
    q, k, v = qkv(q_len=8, k_len=8, kv_heads=HEADS)
    shaw = posenc.ShawRelativeAttention(DIM, 3)
    assert not posenc.supports_flex(shaw)
    with pytest.raises(ValueError, match="backend='flex' cannot express"):
        attention(q, k, v, encoding=shaw, backend="flex")
    with pytest.raises(ValueError, match="backend must be one of"):
        attention(q, k, v, backend="sdpa")
    with pytest.raises(ValueError, match="no backward on a CPU"):
        attention(q.requires_grad_(True), k, v, encoding=alibi(), backend="flex")
    with pytest.raises(ValueError, match="takes float32, bfloat16 and float16 on a CPU"):
        attention(*(t.detach().double() for t in (q, k, v)), encoding=alibi(), backend="flex")
    with pytest.raises(ValueError, match="not available under"):
        attention(*(t.detach().to("meta") for t in (q, k, v)), encoding=alibi(), backend="flex")
    # Shaw with auto: the eager path, silently (that is not a wrong result)
    with torch.no_grad():
        attention(q, k, v, encoding=shaw)


def test_explicit_flex_without_a_compiler_raises(monkeypatch):
    monkeypatch.setattr(flex, "_compiler_missing", lambda device_type: "no C++ compiler found")
    q, k, v = qkv(q_len=8, k_len=8)
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="no C\\+\\+ compiler found"):
            attention(q, k, v, encoding=alibi(), backend="flex")
        monkeypatch.setattr(flex, "AUTO_MIN_SCORES", 1)
        attention(q, k, v, encoding=alibi(), causal=True)  # auto: eager, silently


# --- the mask the eager path hands to SDPA ---------------------------------------------------


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize(
    "form", ["causal", "bool 4-D", "float 2-D", "bool 3-D heads", "per-sample positions"]
)
def test_sdpa_gets_a_4d_contiguous_mask(name, form, monkeypatch):
    """A 3-D or non-contiguous mask sends SDPA to its slow math path (11.6x on a CPU)."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(posenc.sdpa.F, "scaled_dot_product_attention", spy)
    scheme = SCHEMES[name]()
    q, k, v = (t[:, :, :24] for t in qkv(kv_heads=HEADS))
    kwargs = {"causal": True}
    if form == "bool 4-D":
        kwargs["mask"] = torch.rand(BATCH, 1, 1, 24) > 0.3
    elif form == "float 2-D":
        kwargs["mask"] = torch.randn(24, 24)
    elif form == "bool 3-D heads":
        q, k, v = (t[0] for t in (q, k, v))
        kwargs["mask"] = torch.rand(HEADS, 24, 24) > 0.3
    elif form == "per-sample positions":
        kwargs["k_positions"] = left_padded(24, pads=(0, 5))[1]
    with torch.no_grad():
        attention(q, k, v, encoding=scheme, backend="eager", **kwargs)
    (m,) = seen
    assert m.dim() == 4 and m.is_contiguous()
    assert m.dtype == torch.bool or m.dtype == q.dtype


def test_auto_steps_aside_under_tracing_transforms_and_meta(monkeypatch):
    """Above the threshold, ``auto`` still traces, exports, vmaps and runs on meta tensors."""
    monkeypatch.setattr(flex, "AUTO_MIN_SCORES", 1)
    monkeypatch.setattr(flex, "run", lambda *a, **kw: pytest.fail("flex under a trace"))
    scheme = alibi()
    q, k, v = qkv(q_len=8, k_len=8)

    def f(q, k, v):
        return attention(q, k, v, encoding=scheme, causal=True)

    with torch.no_grad():
        want = attention(q, k, v, encoding=scheme, causal=True, backend="eager")
        torch._dynamo.reset()
        try:
            got = torch.compile(f, fullgraph=True, backend="eager")(q, k, v)
        finally:
            torch._dynamo.reset()
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(torch.vmap(f)(q, k, v), want)
        meta = f(*(t.to("meta") for t in (q, k, v)))
        assert meta.shape == want.shape


# --- many lengths, failures (issue 21); no timing: compiles are counted --------------------------


def _graphs():
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class ManyLengths(posenc.ALiBi):
    """ALiBi under its own class: its own compiled region, so the count is its own."""


def test_twenty_lengths_and_decoding_compile_a_few_graphs():
    """Prefill at 20 lengths, then decoding steps: a few graphs, never one per length."""
    scheme = ManyLengths(HEADS)
    g = torch.Generator().manual_seed(0)
    before = _graphs()
    with torch.no_grad():
        for n in range(40, 40 + 20 * 23, 23):  # 20 lengths, inside and across blocks of 128
            q, k, v = (torch.randn(1, HEADS, n, DIM, generator=g) for _ in range(3))
            got = attention(q, k, v, encoding=scheme, causal=True, backend="flex")
            eager = attention(q, k, v, encoding=scheme, causal=True, backend="eager")
            torch.testing.assert_close(got, eager, rtol=0, atol=2e-5)
        for n in (300, 301, 302, 433):  # one query against a growing cache
            q = torch.randn(1, HEADS, 1, DIM, generator=g)
            k, v = (torch.randn(1, HEADS, n, DIM, generator=g) for _ in range(2))
            got = attention(q, k, v, encoding=scheme, causal=True, backend="flex")
            eager = attention(q, k, v, encoding=scheme, causal=True, backend="eager")
            torch.testing.assert_close(got, eager, rtol=0, atol=2e-5)
    # static first graph, then one with dynamic lengths; decoding (q_len 1) specialises once more
    assert _graphs() - before <= 4


def test_per_sample_positions_at_many_lengths_compile_per_bucket_only():
    """Position tables and padding masks are padded to power-of-two buckets: few graphs."""
    scheme = type("BucketedALiBi", (posenc.ALiBi,), {})(HEADS)
    before = _graphs()
    with torch.no_grad():
        for n in range(130, 250, 12):  # 10 lengths, all in the 256 bucket
            q, k, v = qkv(n, n)
            keep, pos = left_padded(n)
            kw = dict(encoding=scheme, causal=True, mask=keep[:, None, None, :], k_positions=pos)
            got = attention(q, k, v, backend="flex", **kw)
            torch.testing.assert_close(got, attention(q, k, v, backend="eager", **kw), rtol=0,
                                       atol=2e-5)  # fmt: skip
    assert _graphs() - before <= 3


class Untraceable(posenc.ALiBi):
    """A score_mod that torch.compile cannot capture in one graph (a graph break)."""

    def score_mod(self, ctx):
        inner = super().score_mod(ctx)

        def mod(score, b, h, qp, kp):
            torch._dynamo.graph_break()
            return inner(score, b, h, qp, kp)

        return mod


def test_a_failure_is_remembered_for_its_scheme_only_and_auto_warns_once(monkeypatch):
    monkeypatch.setattr(flex, "AUTO_MIN_SCORES", 0)
    broken, healthy = Untraceable(HEADS), type("HealthyALiBi", (posenc.ALiBi,), {})(HEADS)
    attends = []
    attend = broken.attend
    monkeypatch.setattr(broken, "attend", lambda *a: attends.append(1) or attend(*a))
    q, k, v = (t[:1, :, :100] for t in qkv())
    with torch.no_grad():
        with pytest.warns(RuntimeWarning, match="Untraceable takes the eager path"):
            got = attention(q, k, v, encoding=broken, causal=True)
        # the eager path ran (not FlexAttention uncompiled), and gave the eager result
        assert attends == [1]
        torch.testing.assert_close(got, attention(q, k, v, encoding=broken, causal=True,
                                                  backend="eager"), rtol=0, atol=0)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: no second warning
            attention(q, k, v, encoding=broken, causal=True)
            # the other scheme keeps its fused path, on the same device and signature
            out = attention(q, k, v, encoding=healthy, causal=True, backend="flex")
        torch.testing.assert_close(out, attention(q, k, v, encoding=healthy, causal=True,
                                                  backend="eager"), rtol=0, atol=2e-5)  # fmt: skip
        assert flex.flex_available("cpu")
        with pytest.raises(RuntimeError, match="cannot run Untraceable here: compiling"):
            attention(q, k, v, encoding=broken, causal=True, backend="flex")
    assert {name for name, *_ in flex.failures()} == {"Untraceable"}


def test_a_full_region_is_replaced_by_a_fresh_one_never_refused_or_uncompiled(monkeypatch):
    """Past a region's recompile limit the next graph compiles in a fresh region."""
    from posenc import _compile

    monkeypatch.setattr(_compile, "RECOMPILE_LIMIT", 1)
    scheme = type("LimitedALiBi", (posenc.ALiBi,), {})(HEADS)
    attends = []
    attend = scheme.attend
    monkeypatch.setattr(scheme, "attend", lambda *a: attends.append(1) or attend(*a))
    before = _graphs()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # per-sample positions of 100 and 300 tokens: tables of two buckets (256 and 512),
        # two graphs of one signature, through a region that holds one
        for n in (100, 300, 100):
            q, k, v = qkv(n, n, seed=n)
            kw = dict(encoding=scheme, causal=True, k_positions=torch.arange(n).expand(BATCH, n))
            got = attention(q, k, v, backend="flex", **kw)
            want = attention(q, k, v, backend="eager", **kw)
            torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    # no fallback to the eager path, and FlexAttention never ran uncompiled (it warns then)
    said = [str(w.message) for w in caught if not issubclass(w.category, DeprecationWarning)]
    assert not [m for m in said if "eager path" in m or "flex_attention" in m], said
    assert attends == [1, 1, 1]  # only the eager references ran the eager path
    assert _graphs() - before == 3  # each call compiled: the full region was replaced each time
    assert flex.failures() == {} or all(n != "LimitedALiBi" for n, *_ in flex.failures())


def test_any_order_of_schemes_head_counts_and_dtypes_compiles():
    """One process, one sequence: every fused scheme, two head counts, three dtypes, twice.

    Before posenc compiled with explicit dynamism (issue 26), a second scheme or
    head count made the first one's tables symbolic and the CPU kernel failed to
    build (``.ci/upstream/flex_cpu_symbolic_table.py``).
    """
    kinds = [n for n, cls in posenc.SCHEMES.items() if cls.acts_on == "attention" and cls.fused()]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # auto's fallback would say so
        for round_ in range(2):
            for heads in (4, 2):
                for dtype in (torch.float32, torch.bfloat16, torch.float16):
                    for name in kinds if round_ == 0 else reversed(kinds):
                        scheme = posenc.SCHEMES[name].build(heads, 32, max_len=64)
                        n = 150 + 37 * round_
                        if scheme.reads_input:  # FoX's gates: bound to a layer input
                            x = torch.randn(1, n, scheme.model_dim, generator=g)
                            scheme = scheme.bind(x)
                        q, k, v = (torch.randn(1, heads, n, 32, generator=g) for _ in range(3))
                        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
                        got = attention(q, k, v, encoding=scheme, causal=True, backend="flex")
                        want = attention(q.double(), k.double(), v.double(), causal=True,
                                         encoding=scheme.double(), backend="eager")  # fmt: skip
                        err = (got.double() - want).abs().max().item()
                        assert err < (1e-5 if dtype == torch.float32 else 2e-2), (
                            name,
                            heads,
                            dtype,
                        )
                        scheme.float()
