"""Per-layer position patterns (issue 37, item 4): Llama 4's iRoPE and its query
temperature, Cohere2's RoPE-on-sliding-layers, SmolLM3's NoPE every fourth layer and
Gemma 3's two bases, in posenc and in the lab.

Golden sources: transformers 5.23.0's own modeling code, run on tiny configs built
here (``Llama4TextAttention`` for the temperature; each family's attention modules'
``use_rope`` / ``sliding_window`` attributes and ``config.layer_types``, and each
family's rotary embedding and ``apply_rotary_*`` function for the RoPE reported per
layer), and a float64 loop over Llama 4's formula.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

import posenc
from posenc.lab import (
    LAYER_PATTERNS,
    PRESETS,
    Lab,
    LabConfig,
    LayerSpec,
    TinyDecoder,
    layer_pattern,
    load_results,
    pattern_from_layers,
    run_all,
)

# --------------------------------------------------------------------------- temperature


def test_temperature_matches_a_float64_loop_over_llama4s_formula():
    positions = torch.arange(0, 200)
    for scale, floor in ((0.1, 8192), (0.1, 8), (0.37, 3), (0.0, 5), (1.5, 1)):
        want = [1 + scale * math.log(math.floor((i + 1) / floor) + 1) for i in range(200)]
        got = posenc.llama4_temperature(
            positions, attn_scale=scale, floor_scale=floor, dtype=torch.float64
        )
        assert got.tolist() == pytest.approx(want, rel=0, abs=1e-15)


def test_tempered_nope_scales_each_query_by_its_position_only():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 3, 9, 4, generator=g, dtype=torch.float64)
    scheme = posenc.TemperedNoPE(attn_scale=0.4, floor_scale=3)
    tau = torch.tensor([1 + 0.4 * math.log((i + 1) // 3 + 1) for i in range(9)], dtype=q.dtype)
    out = posenc.attention(q, k, v, encoding=scheme, causal=True)
    want = posenc.attention(q * tau[:, None], k, v, causal=True)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-14)
    # per-sample positions (a left-padded batch): each row its own temperature
    qp = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [5, 6, 7, 8, 9, 10, 11, 12, 13]])
    q2, k2 = scheme.rotate(q, k, posenc.CallContext.of(q, k, q_positions=qp, k_positions=qp))
    assert torch.equal(k2, k)
    for b in range(2):
        t = [1 + 0.4 * math.log((i + 1) // 3 + 1) for i in qp[b].tolist()]
        want_b = q[b] * torch.tensor(t, dtype=torch.float64)[:, None]
        torch.testing.assert_close(q2[b], want_b, rtol=0, atol=1e-15)
    # attn_scale 0 is NoPE exactly
    zero = posenc.TemperedNoPE(attn_scale=0.0, floor_scale=1)
    assert torch.equal(posenc.attention(q, k, v, encoding=zero), posenc.attention(q, k, v))


def test_tempered_nope_keeps_the_dtype_and_refuses_bad_settings():
    q = torch.randn(1, 2, 5, 4, dtype=torch.bfloat16)
    out = posenc.attention(q, q, q, encoding=posenc.TemperedNoPE(floor_scale=2), causal=True)
    assert out.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="attn_scale"):
        posenc.TemperedNoPE(attn_scale=-0.1)
    with pytest.raises(ValueError, match="floor_scale"):
        posenc.TemperedNoPE(floor_scale=0)
    with pytest.raises(TypeError, match="positions"):
        posenc.llama4_temperature(torch.zeros(3))
    built = posenc.TemperedNoPE.build(4, 8, max_len=16, attn_scale=0.2, floor_scale=4)
    assert (built.attn_scale, built.floor_scale) == (0.2, 4)


def test_tempered_nope_decodes_with_a_kv_cache_as_in_one_call():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 1, 2, 12, 4, generator=g)
    scheme = posenc.TemperedNoPE(attn_scale=0.5, floor_scale=4)
    full = posenc.attention(q, k, v, encoding=scheme, causal=True)
    cache = posenc.KVCache(scheme)

    def step(a, b):
        q_new, *_ = cache.update(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b])
        return cache.attention(q_new)

    first = step(0, 7)
    rest = [step(i, i + 1) for i in range(7, 12)]
    torch.testing.assert_close(torch.cat([first, *rest], dim=2), full, rtol=0, atol=1e-6)


def _llama4(**overrides):
    transformers = pytest.importorskip("transformers")
    settings = dict(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
        num_hidden_layers=4, intermediate_size=16, intermediate_size_mlp=16,
        attention_chunk_size=8, floor_scale=4, attn_scale=0.3,
    )  # fmt: skip
    config = transformers.Llama4TextConfig(**{**settings, **overrides})
    config._attn_implementation = "eager"
    return config


def _causal(q_len, k_len):
    keep = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
    return torch.zeros(1, 1, q_len, k_len).masked_fill(~keep, float("-inf"))


def test_tempered_nope_is_llama4s_nope_layer_attention():
    """transformers' Llama4TextAttention on a NoPE layer (use_rope == 0) against
    posenc.attention with TemperedNoPE, float32, the same random projections: a
    whole sequence, then three more tokens through a DynamicCache (positions from
    the cached length, as transformers counts them)."""
    from transformers import DynamicCache
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    config = _llama4()
    layer = 3
    assert config.no_rope_layers[layer] == 0
    torch.manual_seed(0)
    attention = Llama4TextAttention(config, layer).eval()
    assert not attention.use_rope and attention.attn_temperature_tuning
    scheme = posenc.TemperedNoPE(attn_scale=config.attn_scale, floor_scale=config.floor_scale)
    h = torch.randn(2, 19, 32)

    def ours(x_new, x_all):
        b, n, _ = x_new.shape
        q = attention.q_proj(x_new).view(b, n, 4, 8).transpose(1, 2)
        k = attention.k_proj(x_all).view(b, x_all.shape[1], 4, 8).transpose(1, 2)
        v = attention.v_proj(x_all).view(b, x_all.shape[1], 4, 8).transpose(1, 2)
        out = posenc.attention(q, k, v, encoding=scheme, causal=True, backend="eager")
        return attention.o_proj(out.transpose(1, 2).reshape(b, n, 32))

    with torch.no_grad():
        want, _ = attention(h, None, _causal(19, 19))
        torch.testing.assert_close(ours(h, h), want, rtol=0, atol=1e-6)
        cache = DynamicCache(config=config)
        attention(h[:, :16], None, _causal(16, 16), past_key_values=cache)
        want, _ = attention(h[:, 16:], None, _causal(3, 19), past_key_values=cache)
        torch.testing.assert_close(ours(h[:, 16:], h), want, rtol=0, atol=1e-6)
    # and the temperature matters here: without it the outputs differ
    with torch.no_grad():
        plain = posenc.attention(
            *(p(h).view(2, 19, 4, 8).transpose(1, 2)
              for p in (attention.q_proj, attention.k_proj, attention.v_proj)),
            causal=True,
        )  # fmt: skip
        assert (
            attention.o_proj(plain.transpose(1, 2).reshape(2, 19, 32)) - ours(h, h)
        ).abs().max() > 1e-3


# --------------------------------------------------------------------------- transformers


def _half_rotation(module_cls, apply, config, layer_type=None):
    """(cos, sin) of a transformers rotary embedding, applied by ``apply`` to x."""
    rotary = module_cls(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    x = torch.randn(1, 2, 7, head_dim, dtype=torch.float32)
    pos = torch.arange(3, 10)[None]
    args = (x.transpose(1, 2), pos) if layer_type is None else (x.transpose(1, 2), pos, layer_type)
    cos, sin = rotary(*args)
    rotated, _ = apply(x, x, cos, sin)
    return x, pos[0], rotated


def _check_rope(report_rope, x, positions, rotated):
    ours = report_rope.rotate_one(x, positions)
    torch.testing.assert_close(ours, rotated, rtol=0, atol=2e-6)


def test_llama4_layers_as_llama4_attention_reads_them():
    from transformers.models.llama4.modeling_llama4 import (
        Llama4TextAttention,
        Llama4TextRotaryEmbedding,
        apply_rotary_emb,
    )

    for overrides in ({}, {"num_hidden_layers": 6, "no_rope_layers": [1, 0, 1, 1, 0, 1]},
                      {"attn_temperature_tuning": False}):  # fmt: skip
        config = _llama4(**overrides)
        report = posenc.rope_layers_from_transformers(config)
        assert len(report) == config.num_hidden_layers
        for i, layer in enumerate(report):
            attention = Llama4TextAttention(config, i)
            assert layer.rotates == bool(attention.use_rope)
            assert layer.layer_type == config.layer_types[i]
            chunked = config.layer_types[i] == "chunked_attention"  # create_chunked_causal_mask
            assert layer.chunk == (config.attention_chunk_size if chunked else None)
            assert layer.sliding_window is None
            tempered = attention.attn_temperature_tuning and not attention.use_rope
            assert layer.temperature == ((0.3, 4) if tempered else None)
    # default layers: RoPE on three, NoPE on the fourth, as the released configs
    assert [p.rotates for p in posenc.rope_layers_from_transformers(_llama4())] == [
        True, True, True, False
    ]  # fmt: skip
    # the reported RoPE rotates as apply_rotary_emb with Llama4TextRotaryEmbedding
    config = _llama4()
    rope = posenc.rope_layers_from_transformers(config)[0].rope
    x = torch.randn(1, 7, 2, 8)  # (batch, seq, heads, dim) as Llama 4 rotates
    pos = torch.arange(3, 10)[None]
    freqs = Llama4TextRotaryEmbedding(config)(x, pos)
    rotated, _ = apply_rotary_emb(x, x, freqs)
    _check_rope(rope, x.transpose(1, 2), pos[0], rotated.transpose(1, 2))


def test_cohere2_layers_as_cohere2_attention_reads_them():
    transformers = pytest.importorskip("transformers")
    from transformers.models.cohere2.modeling_cohere2 import (
        Cohere2Attention,
        Cohere2RotaryEmbedding,
        apply_rotary_pos_emb,
    )

    for extra in ({}, {"layer_types": ["sliding_attention", "full_attention"] * 3}):
        config = transformers.Cohere2Config(
            num_hidden_layers=6, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
            sliding_window=16, **extra,
        )  # fmt: skip
        report = posenc.rope_layers_from_transformers(config)
        for i, layer in enumerate(report):
            attention = Cohere2Attention(config, i)
            # Cohere2Attention.forward rotates exactly when self.sliding_window is not None
            assert layer.rotates == (attention.sliding_window is not None)
            assert layer.sliding_window == attention.sliding_window
            assert layer.chunk is None and layer.temperature is None
    config = transformers.Cohere2Config(num_hidden_layers=4, hidden_size=32, num_attention_heads=4)
    x, pos, rotated = _half_rotation(Cohere2RotaryEmbedding, apply_rotary_pos_emb, config)
    _check_rope(posenc.rope_layers_from_transformers(config)[0].rope, x, pos, rotated)


def test_smollm3_layers_as_smollm3_attention_reads_them():
    transformers = pytest.importorskip("transformers")
    from transformers.models.smollm3.modeling_smollm3 import (
        SmolLM3Attention,
        SmolLM3RotaryEmbedding,
        apply_rotary_pos_emb,
    )

    for extra in ({}, {"use_sliding_window": True, "sliding_window": 8},
                  {"no_rope_layers": [0, 1, 1, 0, 1, 1]}):  # fmt: skip
        config = transformers.SmolLM3Config(
            num_hidden_layers=6, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
            **extra,
        )  # fmt: skip
        report = posenc.rope_layers_from_transformers(config)
        for i, layer in enumerate(report):
            attention = SmolLM3Attention(config, i)
            assert layer.rotates == bool(attention.use_rope)
            assert layer.sliding_window == attention.sliding_window
    config = transformers.SmolLM3Config(num_hidden_layers=4, hidden_size=32, num_attention_heads=4)
    assert [p.rotates for p in posenc.rope_layers_from_transformers(config)] == [
        True, True, True, False
    ]  # fmt: skip
    x, pos, rotated = _half_rotation(SmolLM3RotaryEmbedding, apply_rotary_pos_emb, config)
    _check_rope(posenc.rope_layers_from_transformers(config)[0].rope, x, pos, rotated)


def test_gemma3_layers_as_gemma3_attention_reads_them():
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma3.modeling_gemma3 import (
        Gemma3Attention,
        Gemma3RotaryEmbedding,
        apply_rotary_pos_emb,
    )

    config = transformers.Gemma3TextConfig(
        num_hidden_layers=7, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
        head_dim=8, sliding_window=8, rope_local_base_freq=500.0,
    )  # fmt: skip
    report = posenc.rope_layers_from_transformers(config)
    for i, layer in enumerate(report):
        attention = Gemma3Attention(config, i)
        assert layer.rotates
        assert layer.sliding_window == attention.sliding_window
        assert layer.layer_type == attention.layer_type
        # the rotation transformers applies to this layer: its layer type's cos/sin
        x, pos, rotated = _half_rotation(
            Gemma3RotaryEmbedding, apply_rotary_pos_emb, config, attention.layer_type
        )
        _check_rope(layer.rope, x, pos, rotated)
    assert [p.base for p in report] == [500.0] * 5 + [1e6, 500.0]
    with pytest.raises(ValueError, match="bidirectional"):
        posenc.rope_layers_from_transformers(
            transformers.Gemma3TextConfig(num_hidden_layers=2, use_bidirectional_attention=True)
        )


def test_other_model_types_are_refused():
    transformers = pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="model type 'llama'"):
        posenc.rope_layers_from_transformers(transformers.LlamaConfig(num_hidden_layers=2))


# --------------------------------------------------------------------------- the lab


def _init(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("scheme", ["rope", "none", "kerple", "fox", "alibi"])
def test_a_pattern_of_the_models_own_scheme_is_the_model_without_one(scheme):
    torch.manual_seed(3)
    plain = TinyDecoder(16, scheme, 8, layers=3)
    torch.manual_seed(3)
    patterned = TinyDecoder(16, scheme, 8, layers=3, pattern=[LayerSpec()] * 3)
    assert all(torch.equal(a, b) for a, b in zip(_init(plain), _init(patterned), strict=True))
    x = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(0))
    assert torch.equal(plain(x), patterned(x))
    plain.window = patterned.window = 3
    assert torch.equal(plain(x), patterned(x))


def _first_layer_reach(model, i, n=12):
    """Which earlier positions change the one-layer model's output at position i."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 16, (1, n), generator=g)
    base = model(x)[0, i]
    reach = []
    for j in range(i + 1):
        y = x.clone()
        y[0, j] = (y[0, j] + 1) % 16
        if not torch.allclose(model(y)[0, i], base, rtol=0, atol=1e-6):
            reach.append(j)
    return reach


def test_windows_and_chunks_limit_what_a_layer_sees():
    torch.manual_seed(0)
    full = TinyDecoder(16, "rope", 12, layers=1, pattern=[LayerSpec()])
    assert _first_layer_reach(full, 10) == list(range(11))
    window = TinyDecoder(16, "rope", 12, layers=1, pattern=[LayerSpec(window=3)])
    assert _first_layer_reach(window, 10) == [8, 9, 10]  # keys i - 3 < j <= i
    chunk = TinyDecoder(16, "none", 12, layers=1, pattern=[LayerSpec(chunk=4)])
    assert _first_layer_reach(chunk, 10) == [8, 9, 10]  # chunk 8..11, up to i
    assert _first_layer_reach(chunk, 7) == [4, 5, 6, 7]
    # the model-wide window (the recall task's control) applies on top
    both = copy.deepcopy(chunk)
    both.window = 2
    assert _first_layer_reach(both, 7) == [6, 7]


def test_the_labs_patterns_at_4_layers():
    L = 32
    expect = {
        "irope": [("rope", None, 16), ("rope", None, 16), ("rope", None, 16), ("none", None, None)],
        "rnope-swa": [("rope", 16, None)] * 3 + [("none", None, None)],
        "smollm3": [("rope", None, None)] * 3 + [("none", None, None)],
        "gemma3-bases": [("rope", 16, None)] * 3 + [("rope", None, None)],
    }
    assert set(LAYER_PATTERNS) == set(expect)
    for name, layers in expect.items():
        torch.manual_seed(0)
        model = TinyDecoder(16, "rope", L, layers=4, pattern=layer_pattern(name, 4, L))
        got = [
            (n, s.window, s.chunk) for n, s in zip(model.layer_schemes, model.pattern, strict=True)
        ]
        assert got == layers, name
    irope = TinyDecoder(16, "rope", L, layers=4, pattern=layer_pattern("irope", 4, L))
    nope = irope.blocks[3].encoding
    assert isinstance(nope, posenc.TemperedNoPE)
    assert (nope.attn_scale, nope.floor_scale) == (0.1, 16)
    gemma = TinyDecoder(16, "rope", L, layers=4, pattern=layer_pattern("gemma3-bases", 4, L))
    assert [b.encoding.base for b in gemma.blocks] == [100.0, 100.0, 100.0, 1e4]
    # RoPE scaling reaches the RoPE layers only, each keeping its base
    gemma.set_rope_scaling(posenc.RopeScaling.linear(4.0))
    assert [b.encoding.base for b in gemma.blocks] == [100.0, 100.0, 100.0, 1e4]
    assert all(b.encoding.scaling == posenc.RopeScaling.linear(4.0) for b in gemma.blocks)
    irope.set_rope_scaling(posenc.RopeScaling.linear(2.0))
    assert isinstance(irope.blocks[3].encoding, posenc.TemperedNoPE)
    assert "layer_schemes" in repr(irope)


def test_bad_patterns_are_refused():
    with pytest.raises(ValueError, match="one posenc.lab.LayerSpec per layer"):
        TinyDecoder(16, "rope", 8, layers=2, pattern=[LayerSpec()])
    with pytest.raises(ValueError, match="acts on attention"):
        TinyDecoder(16, "sinusoidal", 8, layers=1, pattern=[LayerSpec()])
    with pytest.raises(ValueError, match="shared across layers"):
        TinyDecoder(16, "rope", 8, layers=1, pattern=[LayerSpec("t5")])
    with pytest.raises(ValueError, match="act on attention"):
        LayerSpec("learned")
    with pytest.raises(ValueError, match="temperature needs scheme 'none'"):
        LayerSpec(temperature=(0.1, 4))
    with pytest.raises(ValueError, match="window"):
        LayerSpec(window=0)
    with pytest.raises(ValueError, match="name"):
        layer_pattern("llama5", 4, 32)
    with pytest.raises(ValueError, match="layer_pattern"):
        LabConfig(layer_pattern="llama5")
    with pytest.raises(ValueError, match="layer_pattern needs schemes"):
        LabConfig(layer_pattern="irope", schemes=("rope", "learned"))
    no_rope = TinyDecoder(16, "none", 8, layers=1, pattern=[LayerSpec()])
    with pytest.raises(ValueError, match="scaling needs a layer"):
        no_rope.set_rope_scaling(None)


def test_pattern_from_a_transformers_config_builds_a_lab_model():
    transformers = pytest.importorskip("transformers")
    config = _llama4()  # chunk 8, floor_scale 4
    spec = pattern_from_layers(posenc.rope_layers_from_transformers(config), length_ratio=0.5)
    assert [(s.scheme, s.chunk, s.temperature) for s in spec] == (
        [("rope", 4, None)] * 3 + [("none", None, (0.3, 2))]
    )
    assert spec[0].options == {"base": 500000.0, "layout": "interleaved"}
    cohere = transformers.Cohere2Config(num_hidden_layers=4, hidden_size=32, num_attention_heads=4)
    spec = pattern_from_layers(posenc.rope_layers_from_transformers(cohere), length_ratio=1 / 256)
    assert [(s.scheme, s.window) for s in spec] == [("rope", 16)] * 3 + [("none", None)]
    torch.manual_seed(0)
    model = TinyDecoder(16, "rope", 32, layers=4, pattern=spec)
    assert [getattr(b.encoding, "base", None) for b in model.blocks] == [10000.0] * 3 + [None]
    assert model(torch.zeros(1, 32, dtype=torch.long)).shape == (1, 32, 16)
    with pytest.raises(TypeError, match="LayerPositions"):
        pattern_from_layers([None])


def test_presets_carry_the_patterns_and_old_configs_read_unchanged():
    for name in LAYER_PATTERNS:
        c = PRESETS[name]
        assert (c.layers, c.schemes, c.layer_pattern) == (4, ("rope",), name)
        assert (
            dataclasses.replace(c, layer_pattern=None, schemes=("rope", "none"))
            == PRESETS["baseline-4l"]
        )
        assert LabConfig.from_dict(c.to_dict()) == c
    assert PRESETS["baseline-4l"].layer_pattern is None
    # one recipe with the recall-warmup ablation: 450 warmup steps, not the recall preset's 150
    assert PRESETS["baseline-4l"].recall_warmup == PRESETS["recall-warmup"].recall_warmup == 450
    for name in ("full", "recall", "smoke"):
        assert "layer_pattern" not in PRESETS[name].to_dict()  # stored configs compare as before


def test_a_pattern_preset_trains_its_pattern_on_the_baselines_seeds():
    """What ``python -m posenc.lab --preset irope --experiments recall`` trains: RoPE
    with the pattern, from the same initial weights as the baseline-4l RoPE model."""
    short = dict(recall_steps=2, recall_probe_every=1, recall_probe_sequences=4)
    lab = Lab(dataclasses.replace(PRESETS["irope"], **short))
    model, curve = lab.model("recall", "rope", steps=0)
    assert model.layer_schemes == ("rope", "rope", "rope", "none")
    assert [s.chunk for s in model.pattern] == [16, 16, 16, None]
    assert model.blocks[3].encoding.floor_scale == 16
    base, _ = Lab(dataclasses.replace(PRESETS["baseline-4l"], **short)).model(
        "recall", "rope", steps=0
    )
    assert base.pattern is None and len(base.blocks) == 4
    assert all(torch.equal(a, b) for a, b in zip(_init(model), _init(base), strict=True))
    trained, curve = lab.model("recall", "rope")
    assert len(lab.probes[("recall", "rope", "input")]) >= 1


@pytest.mark.parametrize("name", sorted(LAYER_PATTERNS))
def test_every_pattern_runs_the_recall_experiment_at_smoke_size(name):
    config = dataclasses.replace(
        PRESETS["smoke"], layers=4, schemes=("rope",), layer_pattern=name, recall_steps=4
    )
    out = run_all(config, ["recall"], seeds=[0])
    rows = out["results"]["recall"]
    assert {r["scheme"] for r in rows} >= {"rope", "rope:pi"}
    assert out["config"]["layer_pattern"] == name


def test_the_command_line_runs_a_pattern_preset(tmp_path):
    """``python -m posenc.lab --preset irope --experiments recall --seeds 0``, with the
    preset's budgets cut to seconds (its shape, pattern and lengths kept)."""
    import json
    import subprocess
    import sys

    shrink = (
        "import dataclasses, posenc.lab.lab as L; L.PRESETS['irope'] = dataclasses.replace("
        "L.PRESETS['irope'], recall_steps=2, recall_probe_every=1, recall_probe_sequences=4, "
        "recall_sequences=8, recall_band_answers=8, recall_factors=(1, 2)); "
    )
    args = ["--preset", "irope", "--experiments", "recall", "--seeds", "0", "--out",
            str(tmp_path), "--no-plots", "--no-progress"]  # fmt: skip
    code = (
        f"{shrink}import sys, runpy; sys.argv = ['posenc.lab', *{args!r}]; "
        "runpy.run_module('posenc.lab', run_name='__main__')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    stored = json.loads((tmp_path / "irope.json").read_text())
    assert stored["config"]["layer_pattern"] == "irope" and stored["config"]["layers"] == 4
    assert {r["scheme"] for r in stored["results"]["recall"]} >= {"rope", "rope:pi"}


@pytest.mark.parametrize(
    "preset,models",
    [("baseline-4l", ("rope", "none")), *((name, ("rope",)) for name in LAYER_PATTERNS)],
)
def test_stored_pattern_runs_on_the_recall_task(preset, models):
    """The recall runs the flip-flop chapter shows: each preset's own settings on seeds 0-4
    (paired with baseline-4l's by seed), every model scored in view, by band with and
    without the window control, and each band answer's distance stored for the L + 1 cut."""
    stored = load_results(preset)
    assert stored["seeds"] == [0, 1, 2, 3, 4]
    assert LabConfig.from_dict(stored["config"]) == dataclasses.replace(PRESETS[preset], seed=0)
    rows = stored["results"]["recall"]
    in_view = {(r["scheme"], r["seed"]) for r in rows if r["factor"] == 0}
    assert in_view == {(m, s) for m in models for s in stored["seeds"]}
    bands = ("<L", "L-2L", "2L-4L", "4L-8L")  # at 8L
    for m in models:
        for attention in ("full", "window"):
            far = {(r["seed"], r["band"]) for r in rows if r["scheme"] == m and r["factor"] == 8
                   and r["attention"] == attention}  # fmt: skip
            assert far == {(s, b) for s in stored["seeds"] for b in bands}
    answers = stored["results"]["recall_answers"]
    assert {(r["seed"], r["factor"], r["band"]) for r in answers} == {
        (r["seed"], r["factor"], r["band"]) for r in rows if r["factor"] > 0
    }
