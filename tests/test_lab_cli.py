"""posenc.lab's command line, --jobs, and the verdict rule of posenc.lab.check (issue 19)."""

import json
import subprocess
import sys

import pytest
from scipy import stats

import posenc.lab as lab
from posenc.lab import PRESETS, run_all
from posenc.lab.propositions import Proposition, check, failures, t_interval


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


def test_check_prints_verdicts_of_the_stored_results_and_exits_zero():
    out = _cli("--check", str(lab.RESULTS_DIR))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every stated proposition holds" in out.stdout
    assert out.stdout.count("holds") >= sum(p.stated == "holds" for p in lab.PROPOSITIONS)


def test_check_exits_non_zero_when_a_stated_proposition_fails(tmp_path):
    stored = lab.load_results("full")
    for r in stored["results"]["extrapolation"]:  # make ALiBi's loss at 16L climb
        if r["scheme"] == "alibi" and r["factor"] == 16:
            r["loss"] += 1.0 + r["seed"] * 0.01
            r["excess"] += 1.0 + r["seed"] * 0.01
    (tmp_path / "full.json").write_text(json.dumps(stored))
    out = _cli("--check", str(tmp_path))
    assert out.returncode == 1 and "NOT HOLDING alibi-loss-falls: fails" in out.stdout


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
    names = ["early_tokens"]
    one = run_all(PRESETS["smoke"], names, seeds="0-1")
    two = run_all(PRESETS["smoke"], names, seeds="0-1", jobs=2)
    assert one["results"] == two["results"] and two["seeds"] == [0, 1]


def test_t_interval_matches_scipy():
    values = [0.3, 0.1, 0.25, 0.4, 0.2]
    mean, lo, hi = t_interval(values)
    ref = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    assert abs(lo - ref[0]) < 1e-3 and abs(hi - ref[1]) < 1e-3
    assert t_interval([2.0]) == (2.0, 2.0, 2.0)


def _fake(values):
    return {"extrapolation": [{"seed": s, "x": v} for s, v in enumerate(values)]}


@pytest.mark.parametrize(
    "values,verdict",
    [([0.5, 0.6, 0.55, 0.52, 0.58], "holds"),
     ([-0.5, -0.6, -0.55, -0.52, -0.58], "fails"),
     ([0.5, -0.6, 0.55, -0.52, 0.58], "inconclusive"),
     ([0.5], "inconclusive")],
)  # fmt: skip
def test_the_verdict_rule_is_the_interval_against_the_threshold(values, verdict):
    prop = Proposition("p", "claim", "x", lambda r, s: r["extrapolation"][s]["x"], 0.1)
    (v,) = check(_fake(values), (prop,))
    assert v["verdict"] == verdict and v["values"] == values
    assert failures([v]) == ([] if verdict == "holds" else [v])


def test_a_recall_proposition_counts_only_the_seeds_that_learned():
    """Bimodal outcome: seeds whose model stayed on the plateau give no value."""
    rows = []
    for seed, (learned, acc2) in enumerate([(1.0, 0.9), (0.0, 0.06), (1.0, 0.8), (1.0, 0.95)]):
        rows.append({"seed": seed, "scheme": "t5", "factor": 0, "accuracy": 0.99,
                     "chance": 0.0625, "learned": learned})  # fmt: skip
        for f, acc in ((2, acc2), (8, 0.06)):
            rows.append({"seed": seed, "scheme": "t5", "factor": f, "accuracy": acc,
                         "chance": 0.0625})  # fmt: skip
    props = {p.name: p for p in lab.RECALL_PROPOSITIONS}
    near, far = check({"recall": rows}, (props["recall-t5-2L"], props["recall-t5-8L"]))
    assert near["seeds"] == 3 and near["values"] == [0.8375, 0.7375, 0.8875]
    assert near["verdict"] == "holds" and far["verdict"] == "fails"
    alone = [r for r in rows if r["seed"] in (1, 2)]  # one learned seed: too few
    (v,) = check({"recall": alone}, (props["recall-t5-2L"],))
    assert v["seeds"] == 1 and v["verdict"] == "inconclusive"


def test_compare_reproduces_the_stored_full_run_on_this_machine(tmp_path):
    """The full preset's extrapolation for one seed, re-run wherever the tests run (CI is
    another machine than the one that stored the results), compared statistically."""
    out = _cli(
        "--experiments", "extrapolation", "--seeds", "0", "--out", str(tmp_path),
        "--no-progress", "--no-plots", "--compare",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "stored results reproduced" in out.stdout
