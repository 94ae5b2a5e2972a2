"""posenc.lab: the model over every scheme, the loops, the experiments and the stored results."""

import copy
import dataclasses
import itertools
import json
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
import posenc.lab as lab
from posenc.lab import (
    PRESETS,
    SCHEMES,
    LabConfig,
    LanguageTask,
    RetrievalTask,
    TinyDecoder,
    compare,
    curse_summary,
    evaluate_loss,
    load_results,
    rope_scaling_for,
    run_all,
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _model(scheme, **kw):
    return TinyDecoder(32, scheme, 8, d_model=16, heads=2, **kw)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_runs_and_is_causal(scheme):
    model = _model(scheme, table_len=16 if scheme == "learned" else None).eval()
    x = torch.randint(32, (2, 12))
    y = x.clone()
    y[:, 7:] = (y[:, 7:] + 1) % 32  # change the future only
    with torch.no_grad():
        a, b = model(x), model(y)
    assert a.shape == (2, 12, 32)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-5)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_positions_matter_except_for_nope():
    # With one layer, NoPE sees the prefix as a set: the last position's output is
    # invariant to permuting the earlier tokens; every other scheme's is not.  (With
    # two layers the causal mask already leaks order into NoPE.)
    x = torch.randint(32, (1, 10))
    perm = torch.cat([torch.randperm(9), torch.tensor([9])])
    for scheme in SCHEMES:
        learned = 16 if scheme == "learned" else None
        model = TinyDecoder(32, scheme, 8, d_model=16, heads=2, layers=1, table_len=learned)
        model.eval()
        with torch.no_grad():
            for p in model.parameters():  # leave the initialisation (DA's is distance-blind)
                p.add_(0.3 * torch.randn_like(p))
            same = torch.allclose(model(x)[0, -1], model(x[:, perm])[0, -1], atol=1e-5)
        assert same == (scheme == "none"), scheme


def test_unknown_scheme_and_bad_lengths_raise_value_errors_naming_the_parameter():
    with pytest.raises(ValueError, match="scheme must be one of 'none', 'sinusoidal'"):
        TinyDecoder(32, "bogus", 8)
    with pytest.raises(ValueError, match="train_len must be a positive integer"):
        TinyDecoder(32, "rope", 0)
    model = _model("rope")
    with pytest.raises(ValueError, match="length must be a positive integer, got 0"):
        evaluate_loss(model, LanguageTask(), 0, sequences=1, seed=0)
    with pytest.raises(ValueError, match="inject=.every. needs a scheme that acts on the input"):
        _model("rope", inject="every")
    with pytest.raises(ValueError, match="table_len needs scheme 'learned'"):
        _model("rope", table_len=16)


def test_a_learned_table_refuses_lengths_past_its_rows():
    model = _model("learned", table_len=16)
    assert model.max_len == 16
    evaluate_loss(model, LanguageTask(), 16, sequences=1, seed=0)  # reachable
    with pytest.raises(ValueError, match=r"lengths must be at most 16 for scheme 'learned'"):
        evaluate_loss(model, LanguageTask(), 17, sequences=1, seed=0, name="lengths")
    with pytest.raises(ValueError, match="seq must be at most 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    assert _model("alibi").max_len is None


def test_inject_every_adds_one_table_per_layer():
    model = _model("learned", inject="every")
    assert len(model.tables) == 2
    assert len(_model("learned").tables) == 1


def test_rope_scaling_for_each_method():
    assert rope_scaling_for("pi", 1, 32) is None
    assert rope_scaling_for("none", 4, 32) is None
    kinds = {m: rope_scaling_for(m, 4, 32).kind for m in ("pi", "ntk", "yarn", "llama3")}
    assert kinds == {"pi": "linear", "ntk": "ntk", "yarn": "yarn", "llama3": "llama3"}
    with pytest.raises(ValueError, match="method must be one of"):
        rope_scaling_for("xpos", 2, 32)
    with pytest.raises(ValueError, match="scaling needs scheme 'rope'"):
        _model("alibi").set_rope_scaling(rope_scaling_for("pi", 2, 8))


def test_training_lowers_the_loss_towards_the_floor():
    task = LanguageTask()
    model = _model("alibi")
    before = evaluate_loss(model, task, 8, sequences=32, seed=1).mean().item()
    lab.train(model, task, length=8, steps=60, batch=16, lr=1e-2, seed=0)
    after = evaluate_loss(model, task, 8, sequences=32, seed=1).mean().item()
    floor = task.floor(8).mean().item()
    assert floor < after < before - 0.3


def test_retrieval_batches_score_only_the_query():
    task = RetrievalTask()
    x, y, w = task.batch(4, 12, torch.Generator().manual_seed(0))
    assert w.sum() == 4 and (w[:, -1] == 1).all()
    assert ((y[:, -1] >= task.passkey.fillers) & (y[:, -1] < task.passkey.query)).all()


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 60), min_size=1))
def test_format_seeds_is_the_inverse_of_parse_seeds(seeds):
    text = lab.format_seeds(seeds)
    assert lab.parse_seeds(text) == sorted(seeds)
    # a run of three or more consecutive seeds is one "lo-hi"; shorter runs are listed
    runs = [
        len(list(g)) for _, g in itertools.groupby(enumerate(sorted(seeds)), lambda p: p[1] - p[0])
    ]
    assert len(text.split(",")) == sum(1 if n >= 3 else n for n in runs)


def test_format_seeds_in_prose_and_on_bad_input():
    assert lab.format_seeds((r for r in (27, 26, 25, 25)), dash="\u2013") == "25\u201327"
    assert lab.format_seeds([9, 5, 6, 7, 11, 12]) == "5-7,9,11,12"
    for bad, error in (([], ValueError), ([1, -2], ValueError), ([1.5], TypeError),
                       (["3"], TypeError)):  # fmt: skip
        with pytest.raises(error, match="seeds must"):
            lab.format_seeds(bad)
    for dash in ("", ",", "1", None):  # each would make the text read as other seeds
        with pytest.raises(ValueError, match="dash must"):
            lab.format_seeds([5, 6, 7], dash=dash)


def test_config_and_run_all_refuse_bad_input():
    with pytest.raises(ValueError, match="train_len"):
        LabConfig(train_len=0)
    with pytest.raises(ValueError, match="scheme must be one of"):
        LabConfig(schemes=("rope", "bogus"))
    with pytest.raises(ValueError, match="experiments must be one of"):
        run_all(PRESETS["smoke"], ["bogus"])
    for bad in ("3-1", "a", "-2", "", "1,1"):
        with pytest.raises(ValueError, match="seeds must"):
            lab.parse_seeds(bad)
    assert lab.parse_seeds("0-2,5") == [0, 1, 2, 5]
    with pytest.raises(ValueError, match="jobs"):
        run_all(PRESETS["smoke"], ["early_tokens"], jobs=0)
    assert LabConfig.from_dict(PRESETS["full"].to_dict()) == PRESETS["full"]
    # the warmup ablation changes the warmup and nothing else
    assert PRESETS["recall-warmup"] == dataclasses.replace(PRESETS["recall"], recall_warmup=450)
    legacy = dict(PRESETS["full"].to_dict(), recall_long_steps=9000, recall_long_schemes=["rope"])
    assert LabConfig.from_dict(legacy) == PRESETS["full"]  # settings of a removed experiment
    with pytest.raises(ValueError, match="config must hold LabConfig fields only, got bogus"):
        LabConfig.from_dict(dict(PRESETS["full"].to_dict(), bogus=1))


def test_experiments_take_their_schemes_from_the_config():
    """Every experiment that applies to any scheme runs config.schemes (by default the
    registry); rope_scaling is RoPE's and injection the input tables' own selection."""
    assert LabConfig().schemes == tuple(posenc.SCHEMES) == LabConfig().retrieval_schemes
    tiny = dataclasses.replace(
        PRESETS["smoke"], train_len=4, eval_factors=(1, 2), d_model=8, heads=2, steps=2,
        passkey_steps=2, eval_tokens=16, curse_sequences=2, passkey_sequences=2,
        finetune_steps=1, schemes=("kerple", "sinusoidal", "cope"),
    )  # fmt: skip
    assert tiny.retrieval_schemes == tiny.schemes and tiny.to_dict()["passkey_schemes"] == [
        "kerple", "sinusoidal", "cope"
    ]  # fmt: skip
    out = run_all(tiny, ["training", "extrapolation", "early_tokens", "passkey", "injection"])
    res = out["results"]

    def schemes(name):
        return {r["scheme"] for r in res[name]}

    for name in ("training", "extrapolation", "early_tokens", "passkey"):
        assert schemes(name) == {"kerple", "sinusoidal", "cope"}, name
    assert schemes("injection") == {"sinusoidal"}  # the one input table in the config
    only = dataclasses.replace(tiny, passkey_schemes=("rope",))
    assert {r["scheme"] for r in run_all(only, ["passkey"])["results"]["passkey"]} == {
        "rope", "rope:pi", "rope:ntk", "rope:yarn", "rope:llama3"
    }  # fmt: skip


def test_compare_leaves_out_schemes_the_stored_run_did_not_have(smoke_run):
    stored = load_results("smoke")
    fewer = copy.deepcopy(stored)
    fewer["results"]["early_tokens"] = [
        r for r in fewer["results"]["early_tokens"] if r["scheme"] == "alibi"
    ]
    assert compare(fewer, smoke_run) == []
    missing = copy.deepcopy(smoke_run)
    missing["results"]["early_tokens"] = [
        r for r in missing["results"]["early_tokens"] if r["scheme"] != "alibi"
    ]
    assert any("only in stored" in p for p in compare(stored, missing))


def test_seeds_do_not_depend_on_run_order_or_hashing():
    assert lab.seed_for(0, "init", "lm", "rope", "input") == 1068839088


def test_a_budget_variant_starts_from_the_same_model_and_data(monkeypatch):
    """Only the budget changes: the same initialisation (a 0-step variant is the model
    before training), the same training data seed and the same warmup as the task's own
    budget; a settings variant is a model of its own."""
    c = PRESETS["smoke"]
    calls = []  # training replaced by a record of its settings: the models stay as built
    monkeypatch.setattr(lab.lab, "train", lambda model, data, **kw: calls.append(kw) or [0.0])
    runs = lab.Lab(c)
    first = runs.model("lm", "rope")[0].state_dict()
    second = runs.model("lm", "rope", steps=4 * c.steps)[0].state_dict()
    third = runs.model("lm", "rope", rope_base=1000.0)[0].state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(first["embed.weight"], third["embed.weight"])
    base, longer, other = calls
    assert (longer["steps"], longer["warmup"], longer["seed"]) == (
        4 * c.steps, base["warmup"], base["seed"]
    ) and base["warmup"] == c.steps // 20  # fmt: skip
    assert other["seed"] != base["seed"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_window_limits_every_query_to_its_last_keys(scheme):
    """With ``window = w`` (one layer) the output at a query does not depend on tokens more
    than ``w - 1`` before it; without it, it does."""
    model = TinyDecoder(32, scheme, 8, d_model=16, heads=2, layers=1,
                        table_len=64 if scheme == "learned" else None).eval()  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
        x = torch.randint(32, (2, 40))
        y = x.clone()
        y[:, :20] = torch.randint(32, (2, 20))
        model.window = 8
        # PaTH's transform at token t reads the input at t-2 .. t (its causal convolution
        # of width 3): the transforms between key 20 and its queries reach back to 19, 18
        reach = 2 if scheme == "path" else 0
        if scheme == "fox":
            # FoX's term is c_q - c_k, a difference of running sums over every earlier
            # token: exactly independent of tokens outside the window, but not bitwise
            torch.testing.assert_close(
                model(x)[:, 27:], model(y)[:, 27:], rtol=0, atol=1e-5
            )  # fmt: skip
        else:
            assert torch.equal(model(x)[:, 27 + reach :], model(y)[:, 27 + reach :])  # keys 20..
        assert not torch.allclose(model(x)[:, 20:27], model(y)[:, 20:27])
        model.window = None
        assert not torch.allclose(model(x)[:, 27:], model(y)[:, 27:])


# ------------------------------------------------------------------ stored results


@pytest.fixture(scope="module")
def smoke_run():
    torch.manual_seed(0)
    return run_all(PRESETS["smoke"])


def test_the_smoke_preset_reproduces_its_stored_results(smoke_run):
    """Seed 0 re-run against the stored seeds: within the statistical tolerance of compare."""
    stored = load_results("smoke")
    # the flip-flop experiments came after the stored smoke run; compare skips what a stored
    # run lacks, and tests/test_lab_flipflop.py runs them at smoke size
    added_later = {"fflm", "fflm_curve", "recall_lead", "lm_budget"}
    assert set(stored["results"]) == set(lab.EXPERIMENTS) - added_later
    assert len(stored["seeds"]) >= 3
    assert compare(stored, smoke_run) == []
    same_seed = {n: [r for r in rows if r["seed"] == 0] for n, rows in stored["results"].items()}
    assert compare(dict(stored, results=same_seed), smoke_run, {"spread": 0.0}) == []


def test_compare_is_statistical_and_catches_drift(smoke_run):
    stored = load_results("smoke")
    drifted = copy.deepcopy(smoke_run)
    row = next(r for r in drifted["results"]["extrapolation"] if r["scheme"] == "alibi")
    row["loss"] += 10.0  # far outside any seed spread
    drifted["results"]["passkey"][0]["accuracy"] -= 0.9
    problems = compare(stored, drifted)
    assert len(problems) == 2, problems
    assert any("extrapolation[scheme=alibi" in p and ".loss" in p for p in problems)
    # a shift inside the spread of the stored seeds passes
    sd = lab.run._sd([r["loss"] for r in stored["results"]["extrapolation"]
                              if r["scheme"] == "alibi" and r["factor"] == 1])  # fmt: skip
    nudged = copy.deepcopy(smoke_run)
    for r in nudged["results"]["extrapolation"]:
        r["loss"] += min(sd, 0.005)
    assert compare(stored, nudged) == []
    other = dict(drifted, config=dict(drifted["config"], steps=41))
    assert compare(stored, other) == ["configs differ"]


def test_stored_discovery_results_belong_to_the_current_preset():
    """The discovery set of the full preset: seeds 0-4, the current preset's config, every
    scheme (the five added after the first runs included) and the second RoPE budget."""
    from posenc.lab.experiments import PRESET_EXPERIMENTS

    stored = load_results("full")
    schemes = tuple(stored["config"]["schemes"])
    assert set(schemes) == set(PRESETS["full"].schemes)
    for name in ("training", "extrapolation", "early_tokens", "passkey", "positions", "sliding"):
        assert {r["scheme"].split(":")[0] for r in stored["results"][name]} == set(schemes), name
    assert "rope_budget" in stored["results"]
    assert LabConfig.from_dict(stored["config"]) == dataclasses.replace(
        PRESETS["full"], seed=0, schemes=schemes
    )
    assert stored["seeds"] == [0, 1, 2, 3, 4]
    assert set(stored["results"]) <= set(PRESET_EXPERIMENTS["full"])
    for name, rows in stored["results"].items():
        assert {r["seed"] for r in rows} == set(stored["seeds"]), name
    ext = stored["results"]["extrapolation"]
    assert len(ext) == 5 * len(schemes) * len(PRESETS["full"].eval_factors)


def test_stored_confirmation_results_of_the_full_preset():
    """Seeds 5-14, the current preset: 5-9 every experiment and scheme, 10-14 the
    experiments of the stated claims for the eight schemes they are about; every stated
    proposition of the preset has a verdict, and every interval lies in its range."""
    from posenc.lab.experiments import PRESET_EXPERIMENTS

    stored = load_results("full", split="confirmation")
    assert LabConfig.from_dict(stored["config"]) == dataclasses.replace(PRESETS["full"], seed=5)
    assert stored["seeds"] == list(range(5, 15))
    assert set(stored["results"]) == set(PRESET_EXPERIMENTS["full"])
    for name, rows in stored["results"].items():
        assert {r["seed"] for r in rows} >= set(range(5, 10)), name
    assert {r["scheme"] for r in stored["results"]["extrapolation"] if r["seed"] >= 10} == set(
        lab.propositions.RECALL_STATED_SCHEMES
    )
    verdicts = {v["name"]: v for v in lab.check(stored)}
    for p in lab.PROPOSITIONS:
        if p.stated and p.preset == "full":
            assert verdicts[p.name]["verdict"] != "no rows", p.name
    for v in verdicts.values():
        if v["kind"] == "rate" and v["verdict"] != "no rows":
            assert 0 <= v["lo"] < v["hi"] <= 1, v["name"]


def test_stored_confirmation_results_of_the_recall_preset():
    """The recall confirmation seeds: the frozen recall preset (9,000 steps, warmup 150),
    every recall experiment, seeds 5-9 of every registered scheme and 5-14 of the eight
    with stated recall claims (the plan in posenc.lab.propositions), rows by band with the
    window-of-L control, and a verdict for every stated recall proposition."""
    from posenc.lab.experiments import PRESET_EXPERIMENTS

    stored = load_results("recall", split="confirmation")
    schemes = tuple(stored["config"]["schemes"])
    assert LabConfig.from_dict(stored["config"]) == dataclasses.replace(
        PRESETS["recall"], seed=5, schemes=schemes
    )
    assert stored["seeds"] == list(range(5, 15))
    assert set(stored["results"]) == set(PRESET_EXPERIMENTS["recall"])
    for name, rows in stored["results"].items():
        assert {r["seed"] for r in rows} == set(stored["seeds"]), name
    seeds_of: dict[str, set[int]] = {}
    for r in stored["results"]["recall"]:
        seeds_of.setdefault(r["scheme"].split(":")[0], set()).add(r["seed"])
    stated = {p.name.split("-")[1].split(":")[0] for p in lab.PROPOSITIONS
              if p.stated and p.preset == "recall"}  # fmt: skip
    assert len(stated) == 8 and set(seeds_of) == set(PRESETS["recall"].schemes)
    for scheme, seeds in seeds_of.items():
        assert seeds == set(range(5, 15 if scheme in stated else 10)), scheme
    banded = [r for r in stored["results"]["recall"] if r["factor"] > 0]
    assert {r["attention"] for r in banded} == {"full", "window"}
    assert min(r["answers"] for r in banded) >= PRESETS["recall"].recall_band_answers
    verdicts = {v["name"]: v for v in lab.check(stored)}
    for p in lab.PROPOSITIONS:
        if p.stated and p.preset == "recall" and p.name.split("-")[1].split(":")[0] in schemes:
            assert verdicts[p.name]["verdict"] != "no rows", p.name
    for v in verdicts.values():
        if v["verdict"] != "no rows":
            assert 0 <= v["lo"] < v["hi"] <= 1, v["name"]


def test_stored_warmup_ablation_pairs_with_the_confirmation_models():
    """recall-warmup.json: RoPE and xPos on seeds 5-10 with the 450-step warmup and
    otherwise the frozen recall preset, so each model has a twin of the same seed (same
    initialisation and data) in the recall confirmation set."""
    stored = load_results("recall-warmup")
    assert LabConfig.from_dict(stored["config"]) == dataclasses.replace(
        PRESETS["recall-warmup"], seed=5, schemes=("rope", "xpos")
    )
    assert stored["seeds"] == list(range(5, 11))
    twins = {
        (r["scheme"], r["seed"]): r
        for r in load_results("recall", split="confirmation")["results"]["recall"]
        if r["factor"] == 0
    }
    mine = [r for r in stored["results"]["recall"] if r["factor"] == 0]
    assert len(mine) == 12 and all((r["scheme"], r["seed"]) in twins for r in mine)


def test_the_discovery_recall_results_are_the_older_measure():
    """The recall discovery runs (seeds 0-4) scored pairs 18 to 54 tokens back, 3000 steps
    (RoPE, xPos, Kerple also 9000): a measure the band propositions do not read."""
    stored = load_results("recall")
    config = LabConfig.from_dict(stored["config"])  # its legacy fields dropped
    assert config.recall_steps == 3000 and stored["seeds"] == [0, 1, 2, 3, 4]
    assert set(stored["results"]) == {"recall", "needle_grid", "recall_budget"}
    assert not any("band" in r for r in stored["results"]["recall"])


def test_the_stated_propositions_hold_on_the_discovery_seeds_but_the_rates():
    """The discovery set chose the claims; with five seeds no rate claim can be decided."""
    verdicts = lab.check(load_results("full"))
    bad = {v["name"]: v["verdict"] for v in lab.failures(verdicts)}
    assert bad == {"rope-cannot-retrieve-far": "inconclusive",
                   "alibi-retrieves-far": "inconclusive"}  # fmt: skip
    assert all(v["lo"] < v["hi"] and (v["kind"] != "rate" or 0 <= v["lo"] and v["hi"] <= 1)
               for v in verdicts if v["verdict"] != "no rows" and v["lo"] == v["lo"])  # fmt: skip


def test_curse_summary_of_an_ideal_model_is_the_floor():
    rows = [r for r in load_results("full")["results"]["early_tokens"] if r["seed"] == 0]
    summary = {r["scheme"]: r for r in curse_summary(rows)}
    assert set(summary) == {r["scheme"] for r in rows} | {"floor"}
    f = summary["floor"]
    assert f["gain"] > 0 and f["curse_only"] >= f["long"] - 1e-9


def test_command_line_runs_one_experiment_and_writes_results(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "posenc.lab", "--preset", "smoke", "--experiments",
         "early_tokens", "--out", str(tmp_path), "--no-progress", "--no-plots", "--compare"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "peak memory" in out.stdout and "stored results reproduced" in out.stdout
    written = json.loads((tmp_path / "smoke.json").read_text())
    assert list(written["results"]) == ["early_tokens"]
    bad = subprocess.run(
        [sys.executable, "-m", "posenc.lab", "--experiments", "bogus"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "experiments must be names from" in bad.stderr


def test_importing_posenc_lab_needs_neither_tqdm_nor_matplotlib():
    code = (
        "import sys; sys.modules['tqdm'] = sys.modules['matplotlib'] = None\n"
        "import posenc, posenc.lab; print(len(posenc.lab.SCHEMES))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.split() == [str(len(posenc.SCHEMES))], out.stderr


# ------------------------------------------------------------------ what the chapter states


@pytest.mark.parametrize(
    "preset", ["full", "recall", "recall-warmup", "fflm", "lm-budget", "recall-recipe"]
)
def test_the_withdrawn_claims_are_exactly_those_the_confirmation_set_failed(preset):
    """posenc.lab.replication can neither hide a failure nor drop a claim that replicated."""
    stored = load_results(preset, split="confirmation")
    verdicts = lab.check(stored, lab.propositions_for(preset))
    assert set(lab.WITHDRAWN[preset]) == {v["name"] for v in lab.failures(verdicts)}


def test_a_withdrawal_only_removes_a_stated_claim_of_its_preset():
    assert set(lab.WITHDRAWN) == {
        "full", "recall", "recall-warmup", "fflm", "fflm-length", "lm-budget", "recall-recipe"
    }  # fmt: skip
    for preset, names in lab.WITHDRAWN.items():
        stated = {p.name for p in lab.propositions_for(preset) if p.stated is not None}
        assert set(names) <= stated, preset


def test_the_second_freeze_restates_the_first_with_verdicts_set_by_the_ablation():
    """Every RoPE and xPos recall proposition of the first freeze, unchanged but for its
    preset and stated verdict: holds where 6 of the ablation's 6 seeds passed, fails where
    none did, nothing stated otherwise."""
    first = {p.name: p for p in lab.PROPOSITIONS}
    restated = lab.propositions_for("recall-warmup")
    assert {p.name for p in restated} == {
        name for name, p in first.items()
        if p.preset == "recall" and name.split("-")[1].split(":")[0] in ("rope", "xpos")
    }  # fmt: skip
    for p in restated:
        assert p.preset == "recall-warmup"
        same = dataclasses.replace(first[p.name], stated=p.stated)
        assert all(getattr(same, f.name) == getattr(p, f.name) for f in dataclasses.fields(p))
    for v in lab.check(load_results("recall-warmup"), restated):
        assert v["seeds"] == 6, v["name"]
        assert v["stated"] == {6: "holds", 0: "fails"}.get(v["k"]), v["name"]
    assert lab.frozen_hash("recall-warmup") == (
        "de1a4a3f44d2126abfbf1de2774eaa4cecef83ac4282cd34ad4089e9c9ca2674"
    )


def test_stored_confirmation_of_the_second_freeze_is_the_ablation_on_new_seeds():
    """recall-warmup-confirmation.json: the ablation's settings and schemes on seeds 15-24,
    which no recall run before it used."""
    stored = load_results("recall-warmup", split="confirmation")
    ablation = load_results("recall-warmup")
    assert stored["config"] == {**ablation["config"], "seed": 15}
    assert stored["seeds"] == list(range(15, 25))
    earlier = {
        s
        for preset, split in (("recall", "discovery"), ("recall", "confirmation"),
                              ("recall-warmup", "discovery"))
        for s in load_results(preset, split=split)["seeds"]
    }  # fmt: skip
    assert not earlier & set(stored["seeds"])
    models = {(r["scheme"], r["seed"]) for r in stored["results"]["recall"] if r["factor"] == 0}
    assert models == {(s, seed) for s in ("rope", "xpos") for seed in range(15, 25)}


@pytest.mark.parametrize("call", [lab.frozen_hash, lab.propositions_for])
def test_a_preset_without_propositions_is_refused_by_name(call):
    with pytest.raises(ValueError, match="preset must be one the propositions are about.*'smoke'"):
        call("smoke")


def test_lm_budget_pairs_each_variant_with_its_extrapolation_model():
    """A budget variant changes only its budget: at the task's own budget (lm_long_steps =
    steps, or lr scale 1) it is the extrapolation model, loss for loss; at another it differs."""
    from posenc.lab.experiments import extrapolation, lm_budget

    c = dataclasses.replace(
        PRESETS["smoke"], steps=6, eval_tokens=64, eval_factors=(1, 2), schemes=("alibi", "rope"),
        lm_budget_schemes=("rope",), lm_long_steps=6, lm_lr_scales=(1.0, 0.25),
    )  # fmt: skip
    lab_ = lab.Lab(c)
    rows = lm_budget(lab_)
    base = {r["factor"]: r for r in extrapolation(lab_) if r["scheme"] == "rope"}
    assert [(r["steps"], r["lr"], r["factor"]) for r in rows] == [
        (6, c.lr, 1), (6, c.lr, 2), (6, c.lr, 1), (6, c.lr, 2),
        (6, c.lr * 0.25, 1), (6, c.lr * 0.25, 2),
    ]  # fmt: skip
    for r in rows:
        same = r["lr"] == c.lr
        assert (r["loss"] == base[r["factor"]]["loss"]) is same, r
    assert lm_budget(lab.Lab(dataclasses.replace(c, lm_budget_schemes=()))) == []
    assert "lm_budget_schemes" not in PRESETS["full"].to_dict()
    assert lab.LabConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="lm_lr_scales must be > 0"):
        dataclasses.replace(c, lm_lr_scales=(0.0,))
    with pytest.raises(ValueError, match="scheme"):
        dataclasses.replace(c, lm_budget_schemes=("rotary",))
