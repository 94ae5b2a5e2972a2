"""posenc.lab's command line, --jobs, and the rules of posenc.lab.check (issues 19 and 27)."""

import dataclasses
import json
import subprocess
import sys
import time

import pytest
from scipy import stats

import posenc.lab as lab
from posenc.lab import PRESETS, run_all
from posenc.lab.propositions import Proposition, check, failures, t_interval
from posenc.lab.stats import binomial_tail, clopper_pearson, holm, t_test


def _cli(*args, cwd=None, pre=""):
    code = (
        f"{pre}import sys, runpy; sys.argv = ['posenc.lab', *{list(args)!r}]; "
        "runpy.run_module('posenc.lab', run_name='__main__')"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=cwd
    )


def test_help_lists_every_experiment():
    out = _cli("--help")
    assert out.returncode == 0
    for name in lab.EXPERIMENTS:
        assert f"  {name} " in out.stdout, name


@pytest.mark.parametrize(
    "args,message",
    [
        (["--seeds", "3-1"], "seeds must"),
        (["--jobs", "0"], "--jobs must be a positive integer"),
        (["--experiments", "bogus"], "experiments must be names from"),
        (["--check", "/nonexistent-dir"], "directory must hold lab results"),
        (["--device", "tpu"], "--device must be 'cpu' or 'cuda'"),
    ],
)
def test_bad_input_names_the_parameter(args, message):
    out = _cli(*args)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def _named(out, prefix):
    return sorted(line[len(prefix):].split()[0].rstrip(":") for line in out.stdout.splitlines()
                  if line.startswith(prefix))  # fmt: skip


def test_check_on_the_discovery_set_names_what_five_seeds_cannot_decide():
    """Seeds 0-4 chose the claims; on them every stated language-model claim holds as
    stated except the two rate claims, which five seeds cannot decide (5 of 5 seeds gives
    a Clopper-Pearson interval [0.48, 1] against the bar 1/2)."""
    out = _cli("--check")
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"sha256 {lab.frozen_hash()}" in out.stdout
    assert _named(out, "NOT HOLDING") == ["alibi-retrieves-far", "rope-cannot-retrieve-far"], (
        out.stdout
    )
    assert "5 of 5 seeds [0.48, 1.00]" in out.stdout


def test_check_on_the_confirmation_set_withdraws_the_claim_that_did_not_replicate():
    """Seeds 5-14, run after the claims were frozen: of the full preset's 30 stated claims, one
    does not replicate (YaRN against NTK at base 10^4, stated to fail, is inconclusive).  The
    chapter no longer states it, so what it states holds; the exit status still says that a
    frozen stated claim failed (3, not 0), and the tally counts it."""
    out = _cli("--check", "--split", "confirmation")
    assert f"sha256 {lab.frozen_hash()}" in out.stdout and "seeds [5, 6, 7, 8, 9, 10" in out.stdout
    assert out.returncode == 3 and _named(out, "NOT HOLDING") == [], out.stdout
    assert "replicated: 29 of 30 stated claims of the freeze (29 of 30 after Holm" in out.stdout
    assert _named(out, "withdrawn") == ["large-base-yarn-beats-ntk"], out.stdout
    assert "here: inconclusive" in out.stdout
    assert "every proposition the chapter states holds (29 stated, 1 withdrawn" in out.stdout


def test_check_of_the_recall_confirmation_withdraws_the_rotary_claims_that_failed():
    """Recall, seeds 5-14 with the frozen 150-step warmup: RoPE learned on no seed and xPos
    on one, so the stated claims that they learn, and that RoPE scaled at test time (and
    xPos) recall keys L to 2L back at 8L, fail and are withdrawn; the other 19 hold."""
    out = _cli("--preset", "recall", "--check", "--split", "confirmation")
    assert out.returncode == 3 and _named(out, "NOT HOLDING") == [], out.stdout
    assert "replicated: 19 of 25 stated claims of the freeze (17 of 25 after Holm" in out.stdout
    assert _named(out, "withdrawn") == [
        "learns-rope", "learns-xpos", "reach-rope:llama3-L-2L-at-8L", "reach-rope:ntk-L-2L-at-8L",
        "reach-rope:yarn-L-2L-at-8L", "reach-xpos-L-2L-at-8L",
    ], out.stdout  # fmt: skip
    assert "(19 stated, 6 withdrawn after the confirmation runs)" in out.stdout


def test_check_of_the_warmup_ablation_reads_the_second_freeze_and_says_it_chose_the_claims():
    out = _cli("--preset", "recall-warmup", "--check")
    assert "posenc/lab/warmup_propositions.py, sha256 " + lab.frozen_hash("recall-warmup") in (
        out.stdout
    )
    assert "discovery seeds, which chose the stated verdicts" in out.stdout
    assert out.returncode == 0 and "(12 stated, 0 withdrawn" in out.stdout, out.stdout


def test_check_of_the_second_freeze_on_its_confirmation_seeds():
    """Seeds 15-24, run after warmup_propositions.py was committed: every one of its 12
    stated claims replicates."""
    out = _cli("--preset", "recall-warmup", "--check", "--split", "confirmation")
    assert "seeds [15, 16, 17, 18, 19, 20, 21, 22, 23, 24]" in out.stdout
    assert "discovery seeds" not in out.stdout and _named(out, "NOT HOLDING") == []
    assert out.returncode == 0 and "(12 stated, 0 withdrawn" in out.stdout, out.stdout
    assert "replicated: 12 of 12 stated claims of the freeze (12 of 12 after Holm" in out.stdout


def test_check_refuses_discovery_seeds_saved_under_the_confirmation_name(tmp_path):
    """The ablation's seeds 5-10 chose the second freeze's verdicts; saved as its
    confirmation set they would pass as a replication, so the seeds are checked."""
    (tmp_path / "recall-warmup-confirmation.json").write_text(
        lab.results_path("recall-warmup").read_text()
    )
    out = _cli("--preset", "recall-warmup", "--check", str(tmp_path), "--split", "confirmation")
    assert out.returncode == 2 and "holds seeds [5, 6, 7, 8, 9, 10] that" in out.stdout
    assert "confirmation set (15-24)" in out.stdout and "NOT HOLDING" not in out.stdout


def test_check_refuses_a_run_of_another_preset_and_names_it(tmp_path):
    (tmp_path / "full.json").write_text(lab.results_path("smoke").read_text())
    out = _cli("--check", str(tmp_path))
    assert out.returncode == 2 and "NOT HOLDING" not in out.stdout, out.stdout
    assert "holds a run of preset 'smoke' (its config), not of --preset 'full'" in out.stdout


def test_a_withdrawn_claim_does_not_hide_a_stated_one_that_fails(tmp_path):
    """Turning one replicated recall claim (ALiBi recalls L to 2L back at 2L) to fail on
    every confirmation seed fails the check, beside the six withdrawn ones."""
    stored = lab.load_results("recall", split="confirmation")
    for r in stored["results"]["recall"]:
        if r["scheme"] == "alibi" and r.get("band") == "L-2L" and r["factor"] == 2:
            r["accuracy"] = 0.0
    (tmp_path / "recall-confirmation.json").write_text(json.dumps(stored))
    out = _cli("--preset", "recall", "--check", str(tmp_path), "--split", "confirmation")
    assert out.returncode == 1 and _named(out, "NOT HOLDING") == ["reach-alibi-L-2L-at-2L"]
    assert len(_named(out, "withdrawn")) == 6


def test_check_exits_non_zero_when_a_stated_proposition_fails(tmp_path):
    stored = lab.load_results("full")
    for r in stored["results"]["extrapolation"]:  # make ALiBi's loss at 16L climb
        if r["scheme"] == "alibi" and r["factor"] == 16:
            r["loss"] += 1.0 + r["seed"] * 0.01
            r["excess"] += 1.0 + r["seed"] * 0.01
    (tmp_path / "full.json").write_text(json.dumps(stored))
    out = _cli("--check", str(tmp_path))
    assert out.returncode == 1 and "NOT HOLDING alibi-loss-falls: fails" in out.stdout


@pytest.mark.parametrize(
    "content,message",
    [("{}", "holds no result rows"),
     ('{"config": {}, "seeds": [], "results": {"extrapolation": []}}', "holds no result rows")],
)  # fmt: skip
def test_check_fails_on_results_that_hold_nothing(tmp_path, content, message):
    (tmp_path / "full.json").write_text(content)
    out = _cli("--check", str(tmp_path))
    assert out.returncode == 1 and message in out.stdout, out.stdout + out.stderr
    assert str(tmp_path / "full.json") in out.stdout


def test_check_fails_when_a_stated_proposition_has_no_rows(tmp_path):
    stored = lab.load_results("full")
    del stored["results"]["sliding"]
    (tmp_path / "full.json").write_text(json.dumps(stored))
    out = _cli("--check", str(tmp_path))
    assert out.returncode == 1
    assert "NOT HOLDING sliding-alibi-far: no rows for it in" in out.stdout
    assert "(experiment sliding missing)" in out.stdout


def test_a_truncated_results_file_is_named(tmp_path):
    text = lab.results_path("smoke").read_text()
    (tmp_path / "smoke.json").write_text(text[: len(text) // 2])
    out = _cli("--preset", "smoke", "--check", str(tmp_path))
    assert out.returncode == 2 and str(tmp_path / "smoke.json") in out.stderr
    assert "not a complete lab results file" in out.stderr
    with pytest.raises(ValueError, match="smoke.json is not a complete lab results file"):
        lab.load_results("smoke", tmp_path)
    (tmp_path / "a.json").write_text(text[:100])
    out = _cli("--merge", str(tmp_path / "a.json"), "--out", str(tmp_path / "m"))
    assert out.returncode == 2 and "a.json is not a complete lab results file" in out.stderr


def test_seed_and_seeds_together_are_refused():
    out = _cli("--seed", "3", "--seeds", "0", "--experiments", "early_tokens")
    assert out.returncode == 2 and "--seed and --seeds name the seeds twice" in out.stderr


def test_out_naming_a_file_is_refused_before_any_training(tmp_path):
    (tmp_path / "taken").write_text("not a directory")
    start = time.perf_counter()
    out = _cli("--preset", "smoke", "--out", str(tmp_path / "taken"), "--no-progress")
    assert out.returncode == 2 and "--out must name a directory" in out.stderr
    assert "seed 0" not in out.stdout and time.perf_counter() - start < 60


def test_a_run_that_fails_late_keeps_what_it_finished(tmp_path):
    boom = (
        "import posenc.lab.experiments as e\n"
        "def boom(lab): raise RuntimeError('disk full')\n"
        "e.EXPERIMENTS['extrapolation'] = boom\n"
    )
    out = _cli(
        "--preset", "smoke", "--experiments", "early_tokens,extrapolation", "--seeds", "0-1",
        "--schemes", "alibi", "--out", str(tmp_path), "--no-progress", "--no-plots", pre=boom,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED seed 0, experiment extrapolation: RuntimeError: disk full" in out.stdout
    kept = json.loads((tmp_path / "smoke.partial.json").read_text())
    assert {r["seed"] for r in kept["results"]["early_tokens"]} == {0, 1}
    assert kept["results"]["extrapolation"] == [] and len(kept["meta"]["errors"]) == 2
    assert not (tmp_path / "smoke.json").exists()


def test_merge_joins_parts_and_refuses_overlaps(tmp_path):
    names, config = ["early_tokens"], dataclasses.replace(PRESETS["smoke"], schemes=("alibi",))
    for part, seeds in (("a", "0"), ("b", "1")):
        out = run_all(config, names, seeds=seeds)
        (tmp_path / f"{part}.json").write_text(json.dumps(out))
    res = _cli("--preset", "smoke", "--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
               "--out", str(tmp_path / "m"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    merged = json.loads((tmp_path / "m" / "smoke.json").read_text())
    both = run_all(config, names, seeds="0-1")
    assert merged["seeds"] == [0, 1] and merged["results"] == both["results"]
    with pytest.raises(ValueError, match="must not overlap: experiment early_tokens, seed 0"):
        lab.merge(both, json.loads((tmp_path / "a.json").read_text()))


def test_merge_keeps_the_rows_two_scheme_parts_share_once():
    """recall_answers (a seed's band inputs, no scheme) is in every part that ran the seed:
    parts split by scheme merge into the unsplit run, and parts that disagree are refused."""
    stored = lab.load_results("smoke")
    names = ("recall", "recall_answers")
    schemes = sorted({r["scheme"].split(":")[0] for r in stored["results"]["recall"]})
    assert len(schemes) >= 2 and all("scheme" not in r for r in stored["results"]["recall_answers"])

    def part(keep):
        rows = {n: [r for r in stored["results"][n] if "scheme" not in r
                    or r["scheme"].split(":")[0] in keep] for n in names}  # fmt: skip
        return {"config": stored["config"], "seeds": stored["seeds"], "results": rows}

    a, b = part(schemes[:1]), part(schemes[1:])
    merged = lab.merge(a, b)
    assert merged["results"]["recall_answers"] == stored["results"]["recall_answers"]

    def key(r):
        return r["seed"], r["scheme"], r["factor"], r.get("band"), r.get("attention")

    got, want = (sorted(o["results"]["recall"], key=key) for o in (merged, stored))
    assert got == want
    b["results"]["recall_answers"][0] = dict(b["results"]["recall_answers"][0], distances=[1])
    with pytest.raises(
        ValueError, match="must agree on the rows they share: experiment recall_answers"
    ):
        lab.merge(a, b)


def test_compare_prints_its_verdict_without_matplotlib(tmp_path):
    out = _cli(
        "--preset", "smoke", "--experiments", "early_tokens", "--out", str(tmp_path),
        "--no-progress", "--compare",
        pre="import sys; sys.modules['matplotlib'] = None; ",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    verdict = lines.index("stored results reproduced")
    assert "plots skipped: matplotlib is not installed" in lines[verdict + 1]
    assert "peak memory" in out.stdout


def test_jobs_give_the_same_results_as_running_seeds_in_sequence():
    names, config = ["early_tokens"], dataclasses.replace(PRESETS["smoke"], schemes=("alibi", "t5"))
    one = run_all(config, names, seeds="0-1")
    two = run_all(config, names, seeds="0-1", jobs=2)
    assert one["results"] == two["results"] and two["seeds"] == [0, 1]


def test_t_interval_matches_scipy():
    values = [0.3, 0.1, 0.25, 0.4, 0.2]
    mean, lo, hi = t_interval(values)
    ref = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    assert abs(lo - ref[0]) < 1e-3 and abs(hi - ref[1]) < 1e-3
    assert t_interval(values, 0.9, exact=True)[1:] == pytest.approx(
        stats.t.interval(0.9, len(values) - 1, loc=mean, scale=stats.sem(values)), abs=1e-12
    )
    assert t_interval([2.0]) == (2.0, 2.0, 2.0)
    above, below = t_test(values, 0.1)
    assert above == pytest.approx(stats.ttest_1samp(values, 0.1, alternative="greater").pvalue)
    assert below == pytest.approx(stats.ttest_1samp(values, 0.1, alternative="less").pvalue)
    with pytest.raises(ValueError, match="differ"):
        t_test([0.2, 0.2], 0)


@pytest.mark.parametrize(
    "k,n", [(0, 5), (5, 5), (3, 5), (9, 10), (1, 10), (130, 256), (1, 82_000), (26_000, 81_000)]
)
def test_exact_binomial_intervals_and_tails_match_scipy(k, n):
    lo, hi = clopper_pearson(k, n)
    ref = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
    assert (lo, hi) == pytest.approx((ref.low, ref.high), abs=1e-9)
    assert 0 <= lo < hi <= 1  # never outside [0, 1], never of zero width
    above, below = binomial_tail(k, n, 0.5)
    assert above == pytest.approx(stats.binom.sf(k - 1, n, 0.5), rel=1e-9)
    assert below == pytest.approx(stats.binom.cdf(k, n, 0.5), rel=1e-9)


def test_holm_steps_down():
    # sorted 0.01, 0.02, 0.03, 0.04 in a family of 4: 0.04, 0.06, 0.06, 0.06
    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm([0.5, 0.9]) == [1.0, 1.0]


def _fake(values):
    return {"extrapolation": [{"seed": s, "x": v} for s, v in enumerate(values)]}


@pytest.mark.parametrize(
    "values,verdict",
    [([0.5, 0.6, 0.55, 0.52, 0.58], "holds"),
     ([-0.5, -0.6, -0.55, -0.52, -0.58], "fails"),
     ([0.5, -0.6, 0.55, -0.52, 0.58], "inconclusive"),
     ([0.5], "inconclusive"),
     ([0.5, 0.5, 0.5], "inconclusive")],  # no spread: no interval
)  # fmt: skip
def test_the_effect_rule_is_the_interval_against_the_threshold(values, verdict):
    prop = Proposition("p", "claim", "x", lambda r, s: r["extrapolation"][s]["x"], 0.1, "holds",
                       experiments=("extrapolation",))  # fmt: skip
    (v,) = check(_fake(values), (prop,))
    assert v["verdict"] == verdict and v["values"] == values
    assert failures([v]) == ([] if verdict == "holds" else [v])
    if verdict != "inconclusive":
        assert v["p"] < 0.05 and v["lo"] < v["hi"]


@pytest.mark.parametrize(
    "values,verdict",
    [([0.01, -0.01, 0.02, 0.0, 0.005], "holds"),     # 90% interval inside +-0.05
     ([0.2, 0.25, 0.22, 0.21, 0.24], "fails"),       # 95% interval beyond +0.05
     ([0.04, -0.03, 0.09, 0.0, 0.06], "inconclusive")],
)  # fmt: skip
def test_the_equivalence_rule_is_two_one_sided_tests(values, verdict):
    prop = Proposition("p", "claim", "x", lambda r, s: r["extrapolation"][s]["x"], 0.0, "holds",
                       kind="equivalence", margin=0.05, experiments=("extrapolation",))  # fmt: skip
    (v,) = check(_fake(values), (prop,))
    assert v["verdict"] == verdict and v["level"] == 0.9
    lo, hi = stats.t.interval(0.9, 4, loc=sum(values) / 5, scale=stats.sem(values))
    assert (v["lo"], v["hi"]) == pytest.approx((lo, hi), abs=1e-4)


@pytest.mark.parametrize("passes,verdict", [(10, "holds"), (9, "holds"), (8, "inconclusive"),
                                            (1, "fails"), (5, "inconclusive")])  # fmt: skip
def test_the_rate_rule_counts_seeds_with_an_exact_interval(passes, verdict):
    prop = Proposition("p", "claim", "x", lambda r, s: r["extrapolation"][s]["x"], 0.5, "holds",
                       kind="rate", experiments=("extrapolation",))  # fmt: skip
    (v,) = check(_fake([1.0] * passes + [0.0] * (10 - passes)), (prop,))
    assert v["verdict"] == verdict and v["k"] == passes and v["seeds"] == 10
    assert (v["lo"], v["hi"]) == pytest.approx(clopper_pearson(passes, 10), abs=1e-4)
    (five,) = check(_fake([1.0] * 5), (prop,))  # 5 of 5 cannot decide
    assert five["verdict"] == "inconclusive" and five["lo"] == pytest.approx(0.4782, abs=1e-4)


def test_holm_verdicts_beside_the_raw_ones_within_each_family():
    props = tuple(
        Proposition(f"p{i}", "claim", "x", lambda r, s, i=i: r["extrapolation"][s]["x"] + i,
                    0.0, "holds" if i < 2 else None, experiments=("extrapolation",))
        for i in range(3)
    )  # fmt: skip
    values = [0.02, 0.05, 0.01, 0.04, 0.03]  # p0 holds raw (p about 0.02)
    out = {v["name"]: v for v in check(_fake(values), props)}
    assert out["p0"]["family"] == out["p1"]["family"] == "full, stated"
    assert out["p2"]["family"] == "full, reported"
    assert out["p0"]["verdict"] == "holds" and out["p0"]["p"] < 0.05
    p0, p1 = out["p0"]["p"], out["p1"]["p"]
    assert out["p0"]["p_holm"] == pytest.approx(min(1, max(2 * min(p0, p1), max(p0, p1))), abs=1e-6)
    assert out["p2"]["p_holm"] == pytest.approx(out["p2"]["p"], abs=1e-6)  # a family of one
    assert out["p0"]["verdict_holm"] == ("holds" if out["p0"]["p_holm"] < 0.05 else "inconclusive")


def test_reach_counts_a_seed_when_it_beats_the_window_control():
    rows = []
    for seed, (full, window) in enumerate([(0.9, 0.06), (0.5, 0.3), (0.95, 0.05)]):
        rows.append(
            {
                "seed": seed,
                "scheme": "t5",
                "factor": 0,
                "accuracy": 0.99,
                "accuracy_round1": 0.99,
                "accuracy_round2": 0.99,
                "learned": 1.0,
            }
        )
        for attention, acc in (("full", full), ("window", window)):
            rows.append({"seed": seed, "scheme": "t5", "factor": 2, "band": "L-2L",
                         "attention": attention, "accuracy": acc})  # fmt: skip
    props = {p.name: p for p in lab.PROPOSITIONS}
    reach, learns = check({"recall": rows}, (props["reach-t5-L-2L-at-2L"], props["learns-t5"]))
    assert reach["values"] == [1.0, 0.0, 1.0] and reach["k"] == 2 and reach["seeds"] == 3
    assert learns["k"] == 3 and learns["verdict"] == "inconclusive"  # 3 seeds cannot decide


def test_compare_reproduces_the_stored_full_run_on_this_machine(tmp_path):
    """The full preset's extrapolation for one seed and four schemes, re-run wherever the
    tests run (CI is another machine than the one that stored the results), compared
    statistically with the stored seeds of the same schemes."""
    out = _cli(
        "--experiments", "extrapolation", "--seeds", "0", "--schemes", "sinusoidal,rope,alibi,t5",
        "--out", str(tmp_path), "--no-progress", "--no-plots", "--compare",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "stored results reproduced" in out.stdout
