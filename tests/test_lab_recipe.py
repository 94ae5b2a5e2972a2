"""The recall study under one recipe: the trained window-of-L control and the fourth freeze."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc.lab as lab
import posenc.lab.lab as lab_module
from posenc.lab import PRESETS, LabConfig, RecallTask, load_results, run_all
from posenc.lab import recipe_propositions as recipe
from posenc.lab.__main__ import CHECK_FAILS, CHECK_REFUSED, main
from posenc.lab.gains import wilcoxon_exact
from posenc.lab.tasks import LeadRecallTask

SMOKE = dataclasses.replace(
    PRESETS["smoke"], schemes=("rope", "alibi"), recall_control_schemes=("rope",),
    recall_factors=(1, 2, 8), recall_band_answers=16, recall_sequences=16,
)  # fmt: skip


# ------------------------------------------------------------------ the control's data


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), max_lead=st.integers(0, 40), length=st.integers(24, 48))
def test_a_lead_batch_is_the_task_batch_after_fillers(seed, max_lead, length):
    """The moved batch ends with exactly the batch the same data generator gives the task;
    the lead is unscored fillers (value tokens) of at most max_lead tokens."""
    task = RecallTask()
    moved = LeadRecallTask(task, max_lead, seed=seed).batch(
        3, length, torch.Generator().manual_seed(seed)
    )
    plain = task.batch(3, length, torch.Generator().manual_seed(seed))
    n = moved[0].shape[1] - length
    assert 0 <= n <= max_lead
    for a, b in zip(moved, plain, strict=True):
        assert torch.equal(a[:, n:], b)
    assert (moved[2][:, :n] == 0).all() and (moved[0][:, :n] >= task.keys).all()


def test_the_leads_cover_their_range():
    moved = LeadRecallTask(RecallTask(), 4, seed=0)
    g = torch.Generator().manual_seed(0)
    leads = {moved.batch(2, 24, g)[0].shape[1] - 24 for _ in range(200)}
    assert leads == {0, 1, 2, 3, 4}


def test_lead_task_refuses_bad_arguments_by_name():
    with pytest.raises(TypeError, match="task must be a RecallTask"):
        LeadRecallTask(lab.LanguageTask(), 4, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_lead"):
        LeadRecallTask(RecallTask(), -1, seed=0)


# ------------------------------------------------------------------ the trained control


def test_the_trained_control_starts_as_its_full_model_and_sees_its_batches(monkeypatch):
    """Same initial weights, the same recall batches each after a lead, and the window of
    L set before its first step (so it trains with it)."""
    seen = {}

    def fake_train(model, task, *, length, steps, batch, seed, **_):
        first = task.batch(batch, length, torch.Generator().manual_seed(seed))
        seen[model.window] = ({k: v.clone() for k, v in model.state_dict().items()}, first)
        return [0.0]

    monkeypatch.setattr(lab_module, "train", fake_train)
    trainer = lab.Lab(SMOKE)
    trainer.model("recall", "rope")
    control, _ = trainer.model("recall", "rope", window=SMOKE.train_len)
    assert control.window == SMOKE.train_len
    (full_state, full_batch), (ctl_state, ctl_batch) = seen[None], seen[SMOKE.train_len]
    assert all(torch.equal(full_state[k], ctl_state[k]) for k in full_state)
    n = ctl_batch[0].shape[1] - full_batch[0].shape[1]
    assert 0 <= n <= SMOKE.recall_control_lead * SMOKE.train_len
    assert all(torch.equal(a[:, n:], b) for a, b in zip(ctl_batch, full_batch, strict=True))


def test_the_control_variant_is_refused_outside_recall_and_at_another_window():
    trainer = lab.Lab(SMOKE)
    with pytest.raises(ValueError, match="variant window is the recall task's trained control"):
        trainer.model("lm", "rope", window=SMOKE.train_len)
    with pytest.raises(ValueError, match="window=4"):
        trainer.model("recall", "rope", window=4)


def test_control_settings_are_checked_and_left_out_of_stored_configs_when_off():
    assert "recall_control_schemes" not in PRESETS["recall"].to_dict()
    assert "recall_control_lead" not in PRESETS["recall"].to_dict()
    for name in ("recall-recipe", "lm-budget"):
        assert LabConfig.from_dict(PRESETS[name].to_dict()) == PRESETS[name]
    with pytest.raises(ValueError, match="scheme"):
        dataclasses.replace(SMOKE, recall_control_schemes=("rotary",))
    with pytest.raises(ValueError, match="recall_control_lead"):
        dataclasses.replace(SMOKE, recall_control_lead=0)


def test_the_recipe_presets_change_only_what_the_freeze_says():
    r = PRESETS["recall-recipe"]
    assert r == dataclasses.replace(
        PRESETS["recall-warmup"], recall_control_schemes=recipe.CONTROL_SCHEMES,
        recall_control_lead=1, recall_lead=8, needle_scalings=True,
    )  # fmt: skip
    assert r.schemes == recipe.SCHEMES and r.table_len >= 16 * r.train_len
    m = PRESETS["lm-budget"]
    assert m.schemes == m.lm_budget_schemes == recipe.CONTROL_SCHEMES
    assert m.lm_lr_scales == (recipe.LR_SCALE,) and m.lm_long_steps == 1200 and m.steps == 300


@pytest.fixture(scope="module")
def smoke_run():
    return run_all(SMOKE, ["recall", "recall_answers"], seeds=[25, 26])


def test_recall_scores_the_trained_control_beside_the_masked_one(smoke_run):
    rows = smoke_run["results"]["recall"]
    kinds = {(r["scheme"], r["attention"]) for r in rows if r["factor"] > 0}
    assert ("rope", "trained-window") in kinds and ("rope:yarn", "trained-window") in kinds
    assert ("alibi", "window") in kinds and ("alibi", "trained-window") not in kinds
    view = {r["scheme"]: r for r in rows if r["factor"] == 0 and r["seed"] == 25}
    assert 0 <= view["rope"]["control_accuracy"] <= 1 and "control_accuracy" not in view["alibi"]
    # each attention scores the same answers of each band
    counts = {}
    for r in rows:
        if r["factor"] > 0:
            counts.setdefault((r["seed"], r["scheme"], r["factor"], r["band"]), set()).add(
                r["answers"]
            )
    assert all(len(c) == 1 for c in counts.values())


def test_the_freeze_decides_a_smoke_run(smoke_run):
    verdicts = {v["name"]: v for v in lab.check(smoke_run, lab.propositions_for("recall-recipe"))}
    v = verdicts["gain-rope-L-2L-at-8L"]
    assert v["kind"] == "gain" and v["seeds"] == 2 and v["family"] == "recall-recipe"
    assert (
        "gain-alibi-L-2L-at-8L" not in verdicts
        or verdicts["gain-alibi-L-2L-at-8L"]["verdict"] == "no rows"
    )
    assert verdicts["gain-alibi-L-2L-at-8L-masked"]["seeds"] == 2
    assert all(x["p_holm"] is None or x["p_holm"] >= x["p"] for x in verdicts.values())


# ------------------------------------------------------------------ the rules


def test_the_gain_rule():
    holds = [0.30, 0.32, 0.28, 0.35, 0.31, 0.29, 0.33, 0.30, 0.34, 0.36]
    fails = [0.01, 0.0, 0.02, -0.01, 0.01, 0.03, 0.0, 0.02, 0.01, 0.015]
    near = [0.05, 0.07, 0.03, 0.06, 0.04, 0.05, 0.08, 0.02, 0.05, 0.06]
    assert recipe._decide_gain(holds)["verdict"] == "holds"
    assert recipe._decide_gain(fails)["verdict"] == "fails"
    assert recipe._decide_gain(near)["verdict"] == "inconclusive"
    # five seeds: the t-interval lies far above, but Wilcoxon cannot reach 0.05 (1/16)
    five = recipe._decide_gain(holds[:5])
    assert five["lo"] > recipe.SESOI and five["p_wilcoxon"] == 0.0625
    assert five["verdict"] == "inconclusive"
    assert recipe._decide_gain([])["verdict"] == "no rows"
    assert recipe._decide_gain([0.2] * 4)["note"] == "no spread over seeds"
    d = recipe._decide_gain(holds)
    assert d["p_wilcoxon"] == pytest.approx(wilcoxon_exact([x - recipe.SESOI for x in holds]))


def _toy(hits_full, hits_window, distances, train_len=4):
    """A recall result of one seed: one band at 2L and its answers' distances."""
    band = {"seed": 0, "scheme": "rope", "factor": 2, "band": "L-2L", "lo": train_len}
    rows = [{"seed": 0, "scheme": "rope", "factor": 0, "length": train_len}]
    for attention, hits in (("full", hits_full), ("trained-window", hits_window)):
        rows.append({**band, "attention": attention, "hits": hits,
                     "accuracy": hits.count("1") / len(hits)})  # fmt: skip
    answers = [{"seed": 0, "factor": 2, "band": "L-2L", "distances": distances}]
    return {"recall": rows, "recall_answers": answers}


def test_the_gain_counts_answers_from_L_plus_1_only():
    """The answer at distance L (the control sees its value) is dropped from both models."""
    res = _toy("1100", "1000", [4, 5, 6, 7])
    gain = recipe._gain("rope", "L-2L", 2, "trained-window")(res, 0)
    assert gain == pytest.approx(1 / 3)  # full 1 of 3 kept, control 0 of 3
    with pytest.raises(ValueError, match="hits and distances differ"):
        recipe._gain("rope", "L-2L", 2, "trained-window")(_toy("11", "10", [4, 5, 6]), 0)
    assert math.isnan(recipe._kept_accuracy(_toy("1", "1", [4]), 0, "rope", "L-2L", 2, "full"))


def test_budget_view_picks_one_budgets_models():
    rows = [
        {"scheme": "rope", "factor": 1, "steps": 1200, "lr": 0.01, "loss": 1.0},
        {"scheme": "rope", "factor": 1, "steps": 300, "lr": 0.01 / 3, "loss": 2.0},
    ]
    res = {"extrapolation": [{"loss": 3.0}], "lm_budget": rows}
    assert recipe.budget_view(res, steps=1200)["extrapolation"] == rows[:1]
    assert recipe.budget_view(res, lr_scale=recipe.LR_SCALE)["extrapolation"] == rows[1:]
    assert recipe.budget_view(res)["extrapolation"] == []


def test_propositions_of_two_freezes_are_not_decided_together():
    mixed = (*lab.propositions_for("recall")[:1], *lab.propositions_for("recall-recipe")[:1])
    with pytest.raises(ValueError, match="propositions must come from one freeze"):
        lab.check({"recall": []}, mixed)


# ------------------------------------------------------------------ what the freeze states


def _stored(*runs):
    out: dict = {}
    for preset, split in runs:
        for k, rows in load_results(preset, split=split)["results"].items():
            out.setdefault(k, []).extend(rows)
    return out


def test_the_stated_verdicts_follow_the_freeze_rule_on_the_stored_runs():
    """Each stated gain is the gain rule's verdict on the stored masked gains (16 seeds with
    the 450-step warmup for RoPE, xPos and RoPE's scalings; seeds 5-14 otherwise), each
    inconclusive one is reported; each stated learns is 'every seed' or 'none'."""
    warm = _stored(("recall-warmup", "discovery"), ("recall-warmup", "confirmation"))
    conf = _stored(("recall", "confirmation"))
    for (scheme, band, factor), stated in recipe.STATED_GAINS.items():
        src = warm if scheme.split(":")[0] in ("rope", "xpos") else conf
        seeds = sorted({r["seed"] for r in src["recall"] if r["scheme"] == scheme})
        values = [round(recipe._gain(scheme, band, factor, "window")(src, s), 4) for s in seeds]
        verdict = recipe._decide_gain(values)["verdict"]
        assert stated == (verdict if verdict in ("holds", "fails") else None), scheme
    for scheme, stated in recipe.STATED_LEARNS.items():
        src = warm if scheme in ("rope", "xpos") else conf
        learned = [
            r["learned"] for r in src["recall"] if r["scheme"] == scheme and r["factor"] == 0
        ]
        assert stated == {len(learned): "holds", 0: "fails"}.get(int(sum(learned))), scheme
    stated = [p for p in lab.propositions_for("recall-recipe") if p.stated is not None]
    assert len(stated) == 41 and all(not p.name.endswith("-masked") for p in stated)
    assert lab.DECLARED_SEEDS["recall-recipe"]["confirmation"] == recipe.SEEDS
    assert lab.DECLARED_SEEDS["lm-budget"]["confirmation"] == recipe.SEEDS == tuple(range(25, 35))


def test_the_lm_budget_restates_the_first_freezes_length_claims():
    first = {p.name: p for p in lab.PROPOSITIONS}
    props = lab.propositions_for("lm-budget")
    for p in props:
        name, budget = p.name.split("@")
        assert p.stated == (first[name].stated if budget == "300" else None), p.name
    assert {p.name.split("@")[1] for p in props} == {"300", "1200", "lr/3"}


def test_the_wilcoxon_side_decides_with_the_interval():
    """The side the ranks point to: nine gains just above the bar and one far below pull
    the mean below it, but the ranks point above, and the rule does not say "fails"."""
    assert recipe._rank_side([0.1, 0.2, -0.05]) == 1
    assert recipe._rank_side([-0.1, 0.1]) == 0 and recipe._rank_side([]) == 0
    assert recipe._rank_side([0.3, -0.1, -0.2, -0.3]) == -1  # ties share rank 3.5
    values = [0.06] * 5 + [0.07] * 4 + [-3.0]
    d = recipe._decide_gain(values)
    assert d["verdict"] == "inconclusive" and recipe._rank_side([v - 0.05 for v in values]) == 1


def test_a_run_in_parts_keeps_the_control_list_and_trains_its_own_schemes():
    """--schemes replaces the schemes only: the part's config still merges with the others."""
    part = dataclasses.replace(
        PRESETS["recall-recipe"], schemes=("shaw", "cope"), passkey_schemes=None, recall_schemes=()
    )
    assert part.recall_control_schemes == recipe.CONTROL_SCHEMES
    other = dataclasses.replace(part, schemes=("rope",))
    merged = lab.merge(*(
        {"config": c.to_dict(), "seeds": [25], "results": {}, "meta": {}} for c in (part, other)
    ))  # fmt: skip
    assert merged["config"]["schemes"] == ["shaw", "cope", "rope"]


def test_check_reads_the_fourth_freeze_by_its_own_rule(smoke_run, tmp_path, capsys):
    """--check on a recall-recipe file: the gain rule is named, one family for the preset,
    the tally printed; two smoke seeds decide nothing, so the stated claims fail to hold."""
    (tmp_path / "recall-recipe-confirmation.json").write_text(json.dumps(smoke_run))
    argv = ["--check", str(tmp_path), "--preset", "recall-recipe", "--split", "confirmation"]
    assert main(argv) == CHECK_FAILS
    out = capsys.readouterr().out
    assert "gain: 95% t-interval vs the smallest gain of interest" in out
    assert "family: every proposition of the preset" in out
    assert "replicated: 0 of 41 stated claims" in out
    assert (
        "partial: the freeze declared seeds 25-34 for its confirmation set; 8 of them are "
        "missing here ([27, 28, 29, 30, 31, 32, 33, 34])" in out
    )  # the smoke run's 25 and 26
    alien = dict(smoke_run, seeds=[5, 6])
    (tmp_path / "recall-recipe-confirmation.json").write_text(json.dumps(alien))
    assert main(argv) == CHECK_REFUSED


def test_recall_gains_reads_either_control(smoke_run):
    """Against the trained control only the schemes that have one give cells; each cell's
    gains are the full model's accuracy minus that control's, seed by seed."""
    masked = {(g["scheme"], g["band"], g["factor"]): g for g in lab.recall_gains(smoke_run)}
    trained = lab.recall_gains(smoke_run, control="trained-window")
    assert {g["scheme"] for g in trained} == {"rope"} | {
        f"rope:{m}" for m in ("ntk", "yarn", "llama3", "pi")
    }
    rows = smoke_run["results"]["recall"]
    for g in trained:
        acc = {
            (r["seed"], r["attention"]): r["accuracy"]
            for r in rows
            if (r["scheme"], r.get("band"), r["factor"]) == (g["scheme"], g["band"], g["factor"])
        }
        want = [acc[s, "full"] - acc[s, "trained-window"] for s in (25, 26)]
        assert g["gains"] == pytest.approx(want)
        assert (g["scheme"], g["band"], g["factor"]) in masked
    with pytest.raises(ValueError, match="control must be"):
        lab.recall_gains(smoke_run, control="trained")


def test_stored_lm_budget_set_is_the_frozen_preset_on_its_declared_seeds():
    """lm-budget-confirmation.json: the preset's settings on seeds 25-34, which no stored run
    used before, with every scheme's three budgets on every seed, decided by the freeze."""
    stored = load_results("lm-budget", split="confirmation")
    assert stored["config"] == dict(PRESETS["lm-budget"].to_dict(), seed=25)
    assert stored["seeds"] == list(recipe.SEEDS)
    earlier = {
        s
        for preset, split in (("full", "discovery"), ("full", "confirmation"),
                              ("recall", "discovery"), ("recall", "confirmation"),
                              ("recall-warmup", "discovery"), ("recall-warmup", "confirmation"))
        for s in load_results(preset, split=split)["seeds"]
    }  # fmt: skip
    assert not earlier & set(stored["seeds"])
    budgets = {(r["scheme"], r["seed"], r["steps"], round(r["lr"], 9))
               for r in stored["results"]["lm_budget"]}  # fmt: skip
    lr = PRESETS["lm-budget"].lr
    assert budgets == {
        (s, seed, steps, round(rate, 9))
        for s in recipe.CONTROL_SCHEMES for seed in recipe.SEEDS
        for steps, rate in ((1200, lr), (300, lr * recipe.LR_SCALE))
    }  # fmt: skip
    verdicts = lab.check(stored, lab.propositions_for("lm-budget"))
    assert {v["seeds"] for v in verdicts} == {10}
    assert lab.replication_tally(verdicts)["stated"] == 7


def test_stored_recall_recipe_set_is_the_frozen_preset_on_its_declared_seeds():
    """recall-recipe-confirmation.json: the preset's settings on seeds 25-34, which no recall
    run used before, every scheme on every seed under one recipe, each stated scheme with its
    trained control, the moved far bands and RoPE's scaled needle grids, decided by the
    freeze."""
    stored = load_results("recall-recipe", split="confirmation")
    config = PRESETS["recall-recipe"].to_dict()
    lists = ("schemes", "passkey_schemes", "recall_schemes")  # in the parts' order (--merge)
    assert {k: v for k, v in stored["config"].items() if k not in lists} == dict(
        {k: v for k, v in config.items() if k not in lists}, seed=25
    )
    for key in lists:
        assert sorted(stored["config"][key] or []) == sorted(config[key] or []), key
    assert set(stored["config"]["schemes"]) == set(recipe.SCHEMES)
    assert stored["seeds"] == list(recipe.SEEDS)
    earlier = {
        s
        for preset, split in (("recall", "discovery"), ("recall", "confirmation"),
                              ("recall-warmup", "discovery"), ("recall-warmup", "confirmation"))
        for s in load_results(preset, split=split)["seeds"]
    }  # fmt: skip
    assert not earlier & set(stored["seeds"])
    rows = stored["results"]["recall"]
    in_view = {(r["scheme"], r["seed"]) for r in rows if r["factor"] == 0}
    assert in_view == {(s, seed) for s in recipe.SCHEMES for seed in recipe.SEEDS}
    controls = {
        (r["scheme"].split(":")[0], r["seed"])
        for r in rows
        if r.get("attention") == "trained-window"
    }
    assert controls == {(s, seed) for s in recipe.CONTROL_SCHEMES for seed in recipe.SEEDS}
    leads = {r["lead"] for r in stored["results"]["recall_lead"]}
    assert leads == {0, 8 * stored["config"]["train_len"]}
    assert set(recipe.ROPE_SCALED) <= {r["scheme"] for r in stored["results"]["needle_grid"]}
    verdicts = lab.check(stored, lab.propositions_for("recall-recipe"))
    assert {v["seeds"] for v in verdicts if v["verdict"] != "no rows"} == {10}
    tally = lab.replication_tally(verdicts)
    assert tally["stated"] == 41
    assert set(tally["failed"]) == set(lab.WITHDRAWN["recall-recipe"])
