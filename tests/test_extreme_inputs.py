"""Extreme inputs get an exact result or a ValueError naming the parameter and the limit.

Every position, wherever it enters posenc, lies strictly within 2**31 of 0
(``posenc._checks.MAX_POSITION``); relative positions within 2**32.  Memory
never depends on how large a position or T5's ``max_distance`` is: a lookup
of 128 positions allocates at most 32 MiB at any offset.  And importing or
running posenc changes no global compiler setting.

Memory is the peak of tensor memory a call allocates and holds, from
``torch.profiler``'s allocation records (deterministic: it counts bytes
requested, not time), as in ``benchmarks/bench_kv_cache.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import mpmath
import pytest
import torch

import posenc
from posenc import flex
from posenc._memory import peak_tensor_mib as peak_mib
from posenc.scheme import score_mod_bias
from posenc.t5 import _log_boundaries

INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
LIMIT = r"must lie strictly within 2\*\*31 = 2147483648 of 0"
OUT_OF_RANGE = [2**31, -(2**31), INT64_MAX, INT64_MIN]  # each refused
MIB = 2**20
BOUND_MIB = 32


def test_peak_mib_sees_a_large_allocation():
    # the measure must be able to fail: a 64 MiB temporary is seen
    assert peak_mib(lambda: torch.ones(16 * MIB).sum()) >= 63.9


# ---------------------------------------------------------------- the one bound on positions


@pytest.mark.parametrize("p", OUT_OF_RANGE)
def test_axial_coordinates_beyond_two_to_the_31_are_refused(p):
    x = torch.randn(2, 8)
    pos = torch.tensor([[0, 1], [p, 3]])
    with pytest.raises(ValueError, match="positions " + LIMIT):
        posenc.apply_axial_rope(x, pos)
    with pytest.raises(ValueError, match="positions " + LIMIT):
        posenc.axial_rope_cos_sin(pos, 8)
    with pytest.raises(ValueError, match="positions " + LIMIT):
        posenc.axial_sinusoidal_encoding(pos, 8)
    with pytest.raises(ValueError, match="positions " + LIMIT):
        posenc.axial_rope_cos_sin([[0, 1], [p, 3]], 8)  # nested lists are checked before use


def test_axial_coordinates_beyond_int64_and_largest_grids():
    with pytest.raises(ValueError, match="positions " + LIMIT):
        posenc.axial_rope_cos_sin([[2**63, 0]], 8)
    with pytest.raises(ValueError, match=r"sizes\[1\] must be <= 2\*\*31"):
        posenc.grid_positions(0, 2**31 + 1)
    with pytest.raises(ValueError, match=r"width must be <= 2\*\*31"):
        posenc.sinusoidal_table_2d(0, 2**31 + 1, 8)


def test_axial_rope_is_exact_up_to_the_last_accepted_coordinate():
    # float64 angles from exact integers: the cos/sin of p * omega within float32 roundoff,
    # golden values from mpmath with the float64 frequencies taken as exact
    p = torch.tensor([[2**31 - 1, -(2**31 - 1)]])
    cos, sin = posenc.axial_rope_cos_sin(p, 8)
    omega = posenc.rope_frequencies(4).tolist()
    mpmath.mp.prec = 200
    for a, coord in enumerate(p[0].tolist()):
        for i, w in enumerate(omega):
            angle = mpmath.mpf(coord) * mpmath.mpf(w)
            assert abs(float(cos[0, 2 * a + i]) - float(mpmath.cos(angle))) <= 3e-7
            assert abs(float(sin[0, 2 * a + i]) - float(mpmath.sin(angle))) <= 3e-7


def test_traced_axial_coordinates_out_of_range_give_nan():
    fn = torch.compile(lambda p: posenc.axial_rope_cos_sin(p, 8), backend="eager", fullgraph=True)
    cos, sin = fn(torch.tensor([[2**31, 1], [2, 3]]))
    assert cos[0, :2].isnan().all() and sin[0, :2].isnan().all()  # the bad row's first axis
    want = posenc.axial_rope_cos_sin(torch.tensor([[0, 1], [2, 3]]), 8)
    assert torch.equal(cos[0, 2:], want[0][0, 2:]) and torch.equal(cos[1], want[0][1])


@pytest.mark.parametrize("p", OUT_OF_RANGE)
def test_learned_positions_beyond_two_to_the_31_are_refused(p):
    emb = posenc.LearnedEmbedding(8, 4)
    with pytest.raises(ValueError, match="positions"):
        emb(torch.tensor([0, p]))
    with pytest.raises(ValueError, match="positions " + LIMIT):
        emb([0, p])
    if p > 0:
        with pytest.raises(ValueError, match="max_positions=8"):
            emb(2, offset=p)


@pytest.mark.parametrize("p", [INT64_MAX, INT64_MIN])
@pytest.mark.parametrize("name", [n for n, c in posenc.SCHEMES.items() if c.acts_on == "attention"])
def test_int64_extreme_positions_get_a_named_error_from_every_scheme(name, p):
    torch.manual_seed(0)
    scheme = posenc.SCHEMES[name].examples(4, 8)[""]
    q = torch.randn(1, 4, 2, 8)
    pos = torch.tensor([0, p])
    with pytest.raises(ValueError, match="k_positions " + LIMIT):
        posenc.attention(q, q, q, encoding=scheme, k_positions=pos, q_positions=torch.arange(2))
    with pytest.raises(ValueError, match="positions " + LIMIT):
        posenc.KVCache(scheme).update(q, q, q, pos)
    with pytest.raises(ValueError, match="q_offset must keep every query position"):
        posenc.attention(q, q, q, encoding=scheme, q_offset=p, causal=False)


# ---------------------------------------------------------------- sinusoidal: any offset


@pytest.mark.parametrize("p", OUT_OF_RANGE)
def test_sinusoidal_positions_beyond_two_to_the_31_are_refused(p):
    emb = posenc.SinusoidalEmbedding(8)
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="positions " + LIMIT):
        emb.encode(torch.tensor([0, p]))
    with pytest.raises(ValueError, match="positions " + LIMIT):
        emb.encode([0, p])
    with pytest.raises(ValueError, match="positions " + LIMIT):
        emb(x, positions=torch.tensor([0, p]))
    if p > 0:  # the run offset .. offset + 1 leaves the range
        with pytest.raises(ValueError, match=r"offset \.\. offset \+ seq - 1 " + LIMIT):
            emb(x, offset=p - 1)
    assert emb._cache.numel() == 0  # refused before any table was built


def test_sinusoidal_table_sizes_beyond_two_to_the_31_are_refused():
    with pytest.raises(ValueError, match=r"num_positions must be <= 2\*\*31"):
        posenc.sinusoidal_table(2**31 + 1, 8)
    with pytest.raises(ValueError, match=r"num_positions must be <= 2\*\*31"):
        posenc.SinusoidalEmbedding(8).table(INT64_MAX)


def sinusoid_exact(positions, dim, layout):
    """Rows of the table by mpmath: sin and cos of p * w with the float64 w taken as exact."""
    mpmath.mp.prec = 200
    w = posenc.sinusoidal_inv_freq(dim).tolist()
    rows = []
    for p in positions:
        s = [float(mpmath.sin(mpmath.mpf(p) * mpmath.mpf(wi))) for wi in w]
        c = [float(mpmath.cos(mpmath.mpf(p) * mpmath.mpf(wi))) for wi in w]
        rows.append([v for pair in zip(s, c, strict=True) for v in pair] if layout == "interleaved"
                    else s + c)  # fmt: skip
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("offset", [3_000_000, 2**31 - 128])
def test_sinusoidal_lookup_memory_does_not_depend_on_the_offset(offset, layout):
    dim = 512  # a 3e6-row table of this width would be 6 GiB
    x = torch.zeros(128, dim)
    emb = posenc.SinusoidalEmbedding(dim, layout=layout)
    out = {}
    assert peak_mib(lambda: out.setdefault("run", emb(x, offset=offset))) <= BOUND_MIB
    pos = torch.arange(128) + offset
    assert peak_mib(lambda: out.setdefault("at", emb.encode(pos.flip(0)))) <= BOUND_MIB
    assert emb._cache.shape[0] <= 512  # no table up to the offset was kept either
    # exact: within float32 roundoff of sin/cos(p * w) (the documented 2.5e-7, plus the
    # float64 rounding of p * w near 2**31), for both the run and arbitrary positions
    rows = [0, 1, 63, 127]
    want = sinusoid_exact([offset + r for r in rows], dim, layout)
    tol = 2.5e-7 if offset < 2**30 else 5e-7
    assert (out["run"][rows].double() - want).abs().max() <= tol
    assert (out["at"].flip(0)[rows].double() - want).abs().max() <= tol


def test_sinusoidal_rows_past_the_cache_equal_the_table_rows():
    # the same numbers as the table's own rows, to float32 roundoff, at and past the cache
    dim, offset = 64, 1_000_000
    table = posenc.sinusoidal_table(offset + 256, dim)
    emb = posenc.SinusoidalEmbedding(dim)
    run = emb(torch.zeros(256, dim), offset=offset)
    at = emb.encode(torch.tensor([offset + 255, offset, 5]))
    assert (run - table[offset:]).abs().max() <= 4e-7
    assert (at - table[[offset + 255, offset, 5]]).abs().max() <= 4e-7
    # float64 is computed in float64, also past the cache
    run64 = emb(torch.zeros(256, dim, dtype=torch.float64), offset=offset)
    assert (
        run64 - posenc.sinusoidal_table(offset + 256, dim, dtype=torch.float64)[offset:]
    ).abs().max() <= 1e-9


def test_traced_sinusoidal_lookup_is_exact_and_poisons_refused_positions():
    emb = posenc.SinusoidalEmbedding(8)
    fn = torch.compile(emb.encode, backend="eager", fullgraph=True)
    got = fn(torch.tensor([3, -1, 2**31, 7]))
    assert got[[1, 2]].isnan().all()
    assert (got[[0, 3]] - posenc.sinusoidal_table(8, 8)[[3, 7]]).abs().max() <= 2.5e-7


# ------------------------------------------------ T5: any position, any max_distance


@pytest.mark.parametrize("p", OUT_OF_RANGE)
def test_t5_positions_beyond_two_to_the_31_are_refused(p):
    t5 = posenc.T5RelativeBias(4)
    with pytest.raises(ValueError, match="k_positions " + LIMIT):
        t5.buckets(torch.tensor([0]), torch.tensor([0, p]))  # overflowed silently before
    with pytest.raises(ValueError, match="q_positions " + LIMIT):
        t5.bias_from_positions(torch.tensor([p]), torch.tensor([0]))
    with pytest.raises(ValueError, match="q_offset must keep every query position"):
        t5.table(2, q_offset=p)


def test_t5_buckets_are_exact_at_every_int64_relative_position():
    # no error here: key - query at the int64 extremes lies past any max_distance
    rel = torch.tensor([INT64_MIN, INT64_MIN + 1, -(2**32), 2**32, INT64_MAX])
    got = posenc.t5_relative_bucket(rel, num_buckets=32, max_distance=128)
    assert got.tolist() == [15, 15, 15, 31, 31]
    got = posenc.t5_relative_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    assert got.tolist() == [31, 31, 31, 0, 0]
    with pytest.raises(ValueError, match=r"relative_position must lie strictly within 2\*\*63"):
        posenc.t5_relative_bucket([2**63])
    with pytest.raises(ValueError, match=r"max_distance must be <= 2\*\*32"):
        posenc.T5RelativeBias(4, max_distance=2**32 + 1)


def test_traced_t5_positions_out_of_range_give_nan():
    t5 = posenc.T5RelativeBias(2)
    fn = torch.compile(t5.bias_from_positions, backend="eager", fullgraph=True)
    bias = fn(torch.tensor([0, 2**31]), torch.tensor([0, 1, 2]))
    assert bias[:, 1].isnan().all() and not bias[:, 0].isnan().any()


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("max_distance", [10**7, 2**32])
def test_t5_score_mod_memory_does_not_depend_on_max_distance(max_distance, bidirectional):
    # the old fused path held a (num_heads, 2 max_distance + 1) table: 1.4 GiB at 10**7
    t5 = posenc.T5RelativeBias(8, bidirectional=bidirectional, max_distance=max_distance)
    q = torch.randn(1, 8, 128, 16)
    ctx = posenc.CallContext.of(q, q, q_offset=3_000_000 - 128)
    assert peak_mib(lambda: t5.score_mod(ctx)) <= BOUND_MIB


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(
    ("num_buckets", "max_distance"),
    [(32, 128), (8, 12), (6, 7), (10, 30), (32, 10**7), (64, 2**32)],
)
def test_t5_score_mod_equals_the_buckets_at_every_boundary(
    num_buckets, max_distance, bidirectional
):
    t5 = posenc.T5RelativeBias(
        3, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    with torch.no_grad():
        t5.weight.copy_(torch.arange(t5.weight.numel(), dtype=torch.float32).view_as(t5.weight))
    per = num_buckets // 2 if bidirectional else num_buckets
    bounds = _log_boundaries(per, max_distance, torch.device("cpu"))
    near = torch.cat([bounds - 1, bounds, bounds + 1]).clamp(max=2**31 - 1)
    rel = torch.cat([near, -near, torch.arange(-40, 41), torch.tensor([2**31 - 1, 1 - 2**31])])
    # key positions at the distances above from a query at 0, and a query in the middle
    for q0 in (0, 12345):
        k_pos = (rel + q0).clamp(1 - 2**31, 2**31 - 1)
        q_pos = torch.tensor([q0])
        q, k = torch.randn(1, 3, 1, 4), torch.randn(1, 3, k_pos.numel(), 4)
        ctx = posenc.CallContext.of(q, k, q_positions=q_pos, k_positions=k_pos)
        fused = score_mod_bias(t5.score_mod(ctx), ctx)[0]
        want = t5.weight[posenc.t5_relative_bucket(
            k_pos - q0, bidirectional=bidirectional, num_buckets=num_buckets,
            max_distance=max_distance,
        )].t()[:, None, :]  # fmt: skip
        assert torch.equal(fused, want)


@pytest.mark.skipif(not flex.flex_available("cpu"), reason="FlexAttention cannot be compiled here")
def test_t5_fused_attention_memory_does_not_depend_on_max_distance():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 128, 16) for _ in range(3))
    small = posenc.T5RelativeBias(4, num_buckets=32, max_distance=128)
    large = posenc.T5RelativeBias(4, num_buckets=32, max_distance=10**7)
    with torch.no_grad():
        large.weight.copy_(torch.randn_like(large.weight))
        small.weight.copy_(large.weight)
    kw = {"causal": True, "q_positions": torch.arange(128) + 10**6, "backend": "flex"}
    kw["k_positions"] = kw["q_positions"]
    with torch.no_grad():  # FlexAttention has no backward on a CPU
        posenc.attention(q, k, v, encoding=small, **kw)  # compile once: the kernel is shared
        out = {}
        call = lambda: out.setdefault("o", posenc.attention(q, k, v, encoding=large, **kw))  # noqa: E731
        assert peak_mib(call) <= BOUND_MIB
    eager = posenc.attention(q, k, v, encoding=large, **{**kw, "backend": "eager"})
    torch.testing.assert_close(out["o"], eager, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- global compiler settings

SNAPSHOT = """
import json, torch, torch._dynamo, torch._inductor.config
def snap():
    out = {}
    for name, mod in (("dynamo", torch._dynamo.config), ("inductor", torch._inductor.config)):
        for key, value in mod.get_config_copy().items():
            if not key.startswith("_"):
                out[f"{name}.{key}"] = repr(value)
    return out
before = snap()
import posenc
after_import = snap()
torch.manual_seed(0)
q, k, v = (torch.randn(1, 4, 64, 16) for _ in range(3))
if posenc.flex.flex_available("cpu"):
    posenc.attention(q, k, v, encoding=posenc.ALiBi(4), causal=True, backend="flex")
    posenc.attention(q, k, v, encoding=posenc.T5RelativeBias(4), causal=True, backend="auto")
rope = posenc.RotaryEmbedding(16, compiled=True)
rope.rotate(q, k, torch.arange(64), torch.arange(64))
posenc.attention(q, k, v, encoding=rope, causal=True)
after_run = snap()
torch._dynamo.config.cache_size_limit += 1  # the snapshot must see a change
assert snap() != after_run
torch._dynamo.config.cache_size_limit -= 1
def diff(after):
    return {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
new = sorted(set(after_run) - set(before))
print(json.dumps({"import": diff(after_import), "run": diff(after_run), "new": new}))
"""


def test_posenc_changes_no_global_compiler_setting():
    # a fresh interpreter: snapshot torch._dynamo.config and torch._inductor.config, import
    # posenc, run the flex and compiled-RoPE paths, snapshot again
    done = subprocess.run(
        [sys.executable, "-c", SNAPSHOT], capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    changed = json.loads(done.stdout.strip().splitlines()[-1])
    assert changed == {"import": {}, "run": {}, "new": []}


@pytest.mark.parametrize("p", [2**63 - 1, -(2**63)])
def test_xpos_factors_refuse_positions_that_would_wrap_around_the_centre(p):
    xpos = posenc.XPos(16, centre=-5)
    with pytest.raises(ValueError, match="positions must lie strictly within 2\\*\\*31"):
        xpos.factors(torch.tensor([p]), torch.zeros(1), keys=True)


@pytest.mark.parametrize("d", [2**32, -(2**32), 2**63 - 1])
def test_transformer_xl_distances_beyond_two_positions_apart_are_refused(d):
    with pytest.raises(ValueError, match="distances must lie strictly within 2\\*\\*32"):
        posenc.relative_sinusoids(torch.tensor([0, d]), 8)
    assert torch.isfinite(posenc.relative_sinusoids(torch.tensor([2**32 - 1]), 8)).all()


# ------------------------------------------- a user's sweep of edge cases (issue 26, item 7)


def test_xpos_in_float16_refuses_keys_it_would_overflow_and_works_near_its_centre():
    # the factor at 3900 is finite in float16 (about 14 000), but times a key of size 5 it
    # exceeds 65504: refused by name, where it used to give NaN
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 6, 16, generator=g) for _ in range(3))
    pos = torch.arange(3900, 3906)
    kw = dict(q_positions=pos, k_positions=pos)
    with pytest.raises(ValueError, match=r"xPos scales [qk] outside the normal range of torch\.fl"):
        posenc.attention(q.half(), (5 * k).half(), v.half(), encoding=posenc.XPos(16), **kw)
    # the same inputs with the centre near the positions: right to float16's rounding
    near = posenc.XPos(16, centre=3903)
    got = posenc.attention(q.half(), (5 * k).half(), v.half(), encoding=near, **kw)
    want = posenc.attention(q.double(), (5 * k).double(), v.double(), encoding=posenc.XPos(16),
                            **kw)  # fmt: skip
    assert (got.double() - want).abs().max().item() < 2e-2
    # a key the factor leaves inside float16 is not refused
    ok = posenc.attention(
        q.half(),
        k.half(),
        v.half(),
        encoding=posenc.XPos(16),
        q_positions=torch.arange(6) + 60,
        k_positions=torch.arange(6) + 60,
    )
    assert torch.isfinite(ok).all()


@pytest.mark.parametrize(
    "kwargs, stored",
    [({"r1": 1e39}, "inf"), ({"r1": 1e-50}, "0.0"), ({"kind": "power", "r2": 1.99999999}, "2.0")],
)
def test_kerple_refuses_values_its_parameters_cannot_store(kwargs, stored):
    name = "r1" if "r1" in kwargs else "r2"
    with pytest.raises(
        ValueError, match=rf"{name}=.* cannot be stored in torch.float32: it maps to \[{stored}"
    ):
        posenc.Kerple(4, **kwargs)
    wide = posenc.Kerple(4, **kwargs, dtype=torch.float64)  # float64 holds them
    assert torch.isfinite(getattr(wide, name)).all()


@pytest.mark.parametrize("value", ["1.0", b"1", True, None.__class__, {"a": 1}])
def test_kerple_names_a_parameter_of_the_wrong_type(value):
    with pytest.raises(TypeError, match=r"^r1 must be a positive number or one per head"):
        posenc.Kerple(4, r1=value)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: posenc.SCHEMES["cope"].build(8, 64, max_len=-1), "max_len"),
        (lambda: posenc.SCHEMES["learned"].build(8, 64, max_len=0), "max_len"),
        (lambda: posenc.SCHEMES["fire"].build(8, 64, max_len=0), "max_len"),
        (lambda: posenc.SCHEMES["sinusoidal"].build(8, "64"), "head_dim"),
        (lambda: posenc.SCHEMES["rope"].build(8, 63), "head_dim"),
        (lambda: posenc.SCHEMES["t5"].build(8, 64, max_len="8"), "max_len"),
        (lambda: posenc.SCHEMES["none"].build(0, 64), "num_heads"),
        (lambda: posenc.rope_from_transformers({}, head_dim=63), "head_dim"),
    ],
)
def test_errors_name_what_the_caller_wrote(call, name):
    with pytest.raises((TypeError, ValueError), match=rf"^{name} must be"):
        call()


@pytest.mark.parametrize("name", sorted(posenc.SCHEMES))
@pytest.mark.parametrize(
    "args, kwargs, names",
    [((0, 64), {}, "num_heads"), ((4, 0), {}, "head_dim"), ((4, 64), {"max_len": 0}, "max_len"),
     ((4, 64), {"causal": "yes"}, "causal")],
)  # fmt: skip
def test_every_scheme_build_names_its_own_arguments(name, args, kwargs, names):
    with pytest.raises((TypeError, ValueError), match=rf"^{names} must be"):
        posenc.SCHEMES[name].build(*args, **kwargs)
