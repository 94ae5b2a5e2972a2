"""The chapter's propositions as code: one verdict each, from an interval over seeds.

Each :class:`Proposition` computes one number per seed (its *statistic*,
oriented so that the claim says "statistic > threshold") and a 95%
t-interval for its mean over the seeds (Student's t with ``seeds - 1``
degrees of freedom: the seeds are the independent replicates; each seed's
own evaluation noise is inside its number).  The rule is fixed in advance
and the same for every proposition:

* **holds**: the whole interval lies above the threshold;
* **fails**: the whole interval lies below it;
* **inconclusive**: the interval contains it (or fewer than 2 seeds).

The threshold is 0 ("the interval excludes 0") or a minimum effect stated
with the claim (0.1 nats for "breaks", 0.5 for "most of", 0.9 and 0.5 for
accuracies, 0.25 above chance for "recalls"), never a number fitted to the results.

The recall task's outcome is bimodal (a model learns it or stays on a
guessing plateau), so its propositions are stated for the seeds whose model
learned it (:func:`posenc.lab.recall.learned_seeds` counts them): a seed that
did not learn gives no value, and fewer than 2 values is *inconclusive*.  ``stated`` says what the
chapter asserts: ``"holds"`` for a claim it states as true (``python -m
posenc.lab --check`` exits non-zero when one of those does not hold),
``None`` for a question it only reports on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from .experiments import curse_summary
from .stats import t_interval

__all__ = [
    "PROPOSITIONS", "RECALL_PROPOSITIONS", "Proposition", "check", "failures", "t_interval"
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Proposition:
    """A claim, the per-seed statistic that tests it, and the threshold it must clear."""

    name: str
    claim: str
    statistic: str
    # (results, seed) -> statistic of that seed, or None to leave the seed out (the
    # recall propositions are about the seeds whose model learned the task)
    compute: Callable[[dict, int], float | None]
    threshold: float = 0.0
    stated: str | None = "holds"


# ------------------------------------------------------------------ lookups (per seed)


def _row(rows, seed, **keys):
    for r in rows:
        if r.get("seed", seed) == seed and all(r.get(k) == v for k, v in keys.items()):
            return r
    raise KeyError(f"no row with seed={seed} and {keys}")


def _excess(res, seed, scheme, factor):
    return _row(res["extrapolation"], seed, scheme=scheme, factor=factor)["excess"]


def _rope(res, seed, method, finetuned, factor):
    return _row(res["rope_scaling"], seed, method=method, finetuned=finetuned, factor=factor)[
        "excess"
    ]


def _curse(res, seed, scheme):
    rows = [r for r in res["early_tokens"] if r.get("seed", seed) == seed]
    return _row(curse_summary(rows), seed, scheme=scheme)


def _rho(res, seed, scheme):
    """rho of ``scheme``; NaN (so: inconclusive) when its long window gains nothing."""
    rho = _curse(res, seed, scheme)["explained"]
    return math.nan if rho is None else rho


def _far_accuracy(res, seed, scheme, lo_min, reduce=min):
    rows = [r for r in res["passkey"] if r.get("seed", seed) == seed and r["scheme"] == scheme]
    long_len = max(r["length"] for r in rows)
    return reduce(r["accuracy"] for r in rows if r["length"] == long_len and r["lo"] >= lo_min)


def _L(res):
    return min(r["length"] for r in res["extrapolation"])


def _growth(res, seed, scheme, factor):
    return _excess(res, seed, scheme, factor) - _excess(res, seed, scheme, 1)


def _top(res):
    return max(r["factor"] for r in res["extrapolation"])


def _sliding(res, seed, scheme, factor, window):
    return _row(res["sliding"], seed, scheme=scheme, factor=factor, window=window)["loss"]


def _base_excess(res, seed, head_dim, method, factor=4, base=None):
    """Excess of the ``rope_base`` row; ``base`` defaults to the smallest (the lab's)."""
    rows = res["rope_base"]
    base = min(r["base"] for r in rows) if base is None else base
    return _row(rows, seed, base=base, head_dim=head_dim, method=method, factor=factor)["excess"]


def _head_dim(res, pick):
    return pick(r["head_dim"] for r in res["rope_base"])


def _slope_excess(res, seed, scale, factor):
    return _row(res["alibi_slopes"], seed, scale=scale, factor=factor)["excess"]


def _recall(res, seed, scheme, factor, experiment="recall"):
    return _row(res[experiment], seed, scheme=scheme, factor=factor)


def _learned(res, seed, scheme, experiment="recall"):
    return _recall(res, seed, scheme.split(":")[0], 0, experiment)["learned"] == 1.0


def _far_recall(scheme, factor, experiment="recall"):
    """Recall accuracy above chance at context ``factor L``, for seeds that learned."""

    def compute(res, seed):
        if not _learned(res, seed, scheme, experiment):
            return None
        row = _recall(res, seed, scheme, factor, experiment)
        return row["accuracy"] - row["chance"]

    return compute


def _recall_schemes(res):
    return sorted({r["scheme"] for r in res.get("recall", []) if r["factor"] == 0})


def _mean(xs):
    xs = list(xs)
    return math.fsum(xs) / len(xs)


PROPOSITIONS = (
    Proposition(
        "sinusoidal-breaks",
        "The sinusoidal table loses more than 0.1 nats against the floor from L to 4L.",
        "e_sin(4L) - e_sin(L)",
        lambda r, s: _growth(r, s, "sinusoidal", 4),
        0.1,
    ),
    Proposition(
        "learned-breaks",
        "The learned table (rows past L untrained) loses more than 0.1 nats from L to 4L.",
        "e_learned(4L) - e_learned(L)",
        lambda r, s: _growth(r, s, "learned", 4),
        0.1,
    ),
    Proposition(
        "rope-breaks",
        "Plain RoPE (base 100) loses more than 0.1 nats from L to 4L.",
        "e_rope(4L) - e_rope(L)",
        lambda r, s: _growth(r, s, "rope", 4),
        0.1,
    ),
    Proposition(
        "alibi-vs-sinusoidal",
        "Over the longest extrapolation ALiBi's excess grows at least 0.1 nats less than "
        "the sinusoidal table's.",
        "Delta_sin - Delta_alibi, Delta = e(16L) - e(L)",
        lambda r, s: _growth(r, s, "sinusoidal", _top(r)) - _growth(r, s, "alibi", _top(r)),
        0.1,
    ),
    Proposition(
        "alibi-loss-falls",
        "ALiBi's loss at the longest length is below its loss at L.",
        "l_alibi(L) - l_alibi(16L)",
        lambda r, s: (
            _row(r["extrapolation"], s, scheme="alibi", factor=1)["loss"]
            - _row(r["extrapolation"], s, scheme="alibi", factor=_top(r))["loss"]
        ),
    ),
    Proposition(
        "pi-helps",
        "Position interpolation at test time lowers plain RoPE's excess at the longest length.",
        "e_none(16L) - e_pi(16L), no fine-tune",
        lambda r, s: _rope(r, s, "none", False, _top(r)) - _rope(r, s, "pi", False, _top(r)),
        stated=None,  # the chapter reports it failing (issue 19: a failure is a result)
    ),
    Proposition(
        "ntk-helps",
        "NTK-aware scaling at test time lowers plain RoPE's excess at the longest length.",
        "e_none(16L) - e_ntk(16L), no fine-tune",
        lambda r, s: _rope(r, s, "none", False, _top(r)) - _rope(r, s, "ntk", False, _top(r)),
    ),
    Proposition(
        "yarn-beats-ntk",
        "YaRN beats NTK-aware scaling at 4L without fine-tuning (the YaRN paper's order).",
        "e_ntk(4L) - e_yarn(4L), no fine-tune",
        lambda r, s: _rope(r, s, "ntk", False, 4) - _rope(r, s, "yarn", False, 4),
        stated=None,
    ),
    Proposition(
        "finetune-helps",
        "A short fine-tune at 4L with PI lowers PI's excess at 4L.",
        "e_pi(4L) - e_pi,ft(4L)",
        lambda r, s: _rope(r, s, "pi", False, 4) - _rope(r, s, "pi", True, 4),
    ),
    Proposition(
        "scaling-beyond-finetune",
        "With the same fine-tune, PI beats plain RoPE fine-tuned at 4L (the control).",
        "e_none,ft(4L) - e_pi,ft(4L)",
        lambda r, s: _rope(r, s, "none", True, 4) - _rope(r, s, "pi", True, 4),
        stated=None,
    ),
    Proposition(
        "alibi-long-window-gain",
        "For ALiBi, fresh 4L windows score better per token than fresh L windows.",
        "l_short - l_long (ALiBi)",
        lambda r, s: _curse(r, s, "alibi")["gain"],
    ),
    Proposition(
        "curse-explains-most",
        "Most (rho > 0.5) of ALiBi's long-window gain is the early-token curse.",
        "rho_alibi",
        lambda r, s: _rho(r, s, "alibi"),
        0.5,
    ),
    Proposition(
        "alibi-rho-above-floor",
        "ALiBi owes more of its gain to the curse than an ideal model would.",
        "rho_alibi - rho_floor",
        lambda r, s: _rho(r, s, "alibi") - _rho(r, s, "floor"),
        stated=None,
    ),
    Proposition(
        "sinusoidal-long-window-worse",
        "For the sinusoidal table, 4L windows score worse than L windows.",
        "l_long - l_short (sinusoidal)",
        lambda r, s: -_curse(r, s, "sinusoidal")["gain"],
        stated=None,  # the chapter reports it inconclusive
    ),
    Proposition(
        "rope-cannot-retrieve-far",
        "In inputs of 8L, RoPE retrieves a value 2L or more back with accuracy below 0.5.",
        "0.5 - mean accuracy of RoPE, distances >= 2L",
        lambda r, s: 0.5 - _far_accuracy(r, s, "rope", 2 * _L(r), _mean),
    ),
    Proposition(
        "alibi-retrieves-far",
        "In inputs of 8L, ALiBi retrieves at every distance band with accuracy above 0.9.",
        "min accuracy of ALiBi over bands - 0.9",
        lambda r, s: _far_accuracy(r, s, "alibi", 1) - 0.9,
    ),
    Proposition(
        "every-layer-injection",
        "Adding the sinusoidal table in every layer lowers the excess at L "
        "(the input-only variant minus the every-layer one).",
        "e_input(L) - e_every(L), sinusoidal",
        lambda r, s: (
            _row(r["injection"], s, scheme="sinusoidal", inject="input", factor=1)["excess"]
            - _row(r["injection"], s, scheme="sinusoidal", inject="every", factor=1)["excess"]
        ),
        stated=None,
    ),
    Proposition(
        "sliding-helps-at-L",
        "With windows of L, a sliding window (every token with at least 3L/4 of context) "
        "scores ALiBi better than non-overlapping windows on the same tokens.",
        "l_nonoverlapping(L) - l_sliding(L), ALiBi",
        lambda r, s: (
            _sliding(r, s, "alibi", 1, "nonoverlapping") - _sliding(r, s, "alibi", 1, "sliding")
        ),
        stated="holds",
    ),
    Proposition(
        "sliding-hurts-rope-far",
        "With windows of 16L, RoPE scores the same tokens worse with a sliding window "
        "(every token with at least 12L of context) than with non-overlapping windows.",
        "l_sliding(16L) - l_nonoverlapping(16L), RoPE",
        lambda r, s: (
            _sliding(r, s, "rope", _top(r), "sliding")
            - _sliding(r, s, "rope", _top(r), "nonoverlapping")
        ),
        stated=None,
    ),
    Proposition(
        "sliding-alibi-far",
        "With windows of 16L, ALiBi scores the same tokens better with a sliding window "
        "than with non-overlapping windows (more context helps it, a little).",
        "l_nonoverlapping(16L) - l_sliding(16L), ALiBi",
        lambda r, s: (
            _sliding(r, s, "alibi", _top(r), "nonoverlapping")
            - _sliding(r, s, "alibi", _top(r), "sliding")
        ),
        stated="holds",
    ),
    Proposition(
        "ntk-beats-yarn-narrow-head",
        "At the lab's RoPE (base 100, head_dim 16) NTK-aware scaling beats YaRN at 4L "
        "without fine-tuning.",
        "e_yarn(4L) - e_ntk(4L), head_dim 16",
        lambda r, s: (
            _base_excess(r, s, _head_dim(r, min), "yarn")
            - _base_excess(r, s, _head_dim(r, min), "ntk")
        ),
        stated="holds",
    ),
    Proposition(
        "wide-head-yarn-beats-ntk",
        "With one head of dimension 64 (base 100), YaRN beats NTK-aware scaling at 4L "
        "(the YaRN paper's order).",
        "e_ntk(4L) - e_yarn(4L), head_dim 64",
        lambda r, s: (
            _base_excess(r, s, _head_dim(r, max), "ntk")
            - _base_excess(r, s, _head_dim(r, max), "yarn")
        ),
        stated=None,
    ),
    Proposition(
        "large-base-yarn-beats-ntk",
        "At base 10^4 (head_dim 16), YaRN beats NTK-aware scaling at 4L.",
        "e_ntk(4L) - e_yarn(4L), base 10^4",
        lambda r, s: (
            _base_excess(r, s, _head_dim(r, min), "ntk", base=10000.0)
            - _base_excess(r, s, _head_dim(r, min), "yarn", base=10000.0)
        ),
        stated=None,
    ),
    Proposition(
        "large-base-breaks-less",
        "Plain RoPE at base 10^4 grows less from L to 4L than at base 100.",
        "Delta_4L(base 100) - Delta_4L(base 10^4), head_dim 16",
        lambda r, s: (
            (
                _base_excess(r, s, _head_dim(r, min), "none")
                - _base_excess(r, s, _head_dim(r, min), "none", factor=1)
            )
            - (
                _base_excess(r, s, _head_dim(r, min), "none", base=10000.0)
                - _base_excess(r, s, _head_dim(r, min), "none", factor=1, base=10000.0)
            )
        ),
        stated=None,
    ),
    Proposition(
        "gentle-alibi-slopes-worse",
        "ALiBi with every slope divided by 4 has a larger excess at 16L than the paper's slopes.",
        "e_(1/4)(16L) - e_1(16L)",
        lambda r, s: _slope_excess(r, s, 0.25, _top(r)) - _slope_excess(r, s, 1.0, _top(r)),
        stated="holds",
    ),
    Proposition(
        "steep-alibi-slopes-worse",
        "ALiBi with every slope multiplied by 4 has a larger excess at 16L than the paper's "
        "slopes.",
        "e_4(16L) - e_1(16L)",
        lambda r, s: _slope_excess(r, s, 4.0, _top(r)) - _slope_excess(r, s, 1.0, _top(r)),
        stated=None,
    ),
)

#: Recall propositions, per scheme of the recall preset: each is about the seeds whose
#: model learned the task (see the module doc), with a stated minimum effect of 0.25
#: above chance.  Stated as holding: those whose 5 stored seeds all learned and whose
#: interval clears the threshold by a wide margin; the others are reported as measured.
RECALL_SCHEMES = ("none", "sinusoidal", "learned", "rope", "alibi", "t5", "xpos", "kerple")
RECALL_STATED = {
    ("none", "2L"), ("sinusoidal", "2L"), ("learned", "2L"), ("alibi", "2L"), ("alibi", "8L"),
    ("t5", "2L"),
}  # fmt: skip

RECALL_PROPOSITIONS = tuple(
    Proposition(
        f"recall-{scheme}-{label}",
        f"{scheme}: among seeds that learned recall at L, accuracy on pairs L to 2L back, "
        f"shown {label} tokens, is more than 0.25 above chance.",
        f"accuracy({label}) - chance, learned seeds",
        _far_recall(scheme, factor),
        0.25,
        stated="holds" if (scheme, label) in RECALL_STATED else None,
    )
    for scheme in RECALL_SCHEMES
    for factor, label in ((2, "2L"), (8, "8L"))
)

#: The same, for the models of ``recall_budget`` (three times the training steps).
RECALL_LONG_SCHEMES = ("rope", "xpos", "kerple")
RECALL_PROPOSITIONS += tuple(
    Proposition(
        f"recall-long-{scheme}-{label}",
        f"{scheme}, trained three times longer: among seeds that learned recall at L, "
        f"accuracy on pairs L to 2L back, shown {label} tokens, is more than 0.25 above chance.",
        f"accuracy({label}) - chance, learned seeds, long budget",
        _far_recall(scheme, factor, "recall_budget"),
        0.25,
        stated="holds",
    )
    for scheme in RECALL_LONG_SCHEMES
    for factor, label in ((2, "2L"), (8, "8L"))
)


def _scaled_gain(method, factor):
    """Recall accuracy of RoPE scaled by ``method`` minus plain RoPE's, at ``factor L``."""

    def compute(res, seed):
        if not _learned(res, seed, "rope", "recall_budget"):
            return None
        scaled = _recall(res, seed, f"rope:{method}", factor, "recall_budget")["accuracy"]
        return scaled - _recall(res, seed, "rope", factor, "recall_budget")["accuracy"]

    return compute


RECALL_PROPOSITIONS += (
    Proposition(
        "ntk-extends-rope-recall",
        "RoPE trained three times longer, scaled at test time with NTK-aware scaling to the "
        "input's length, recalls pairs L to 2L back, shown 8L tokens, better than plain RoPE.",
        "accuracy(NTK, 8L) - accuracy(plain, 8L), learned seeds, long budget",
        _scaled_gain("ntk", 8),
        stated="holds",
    ),
    Proposition(
        "pi-extends-rope-recall",
        "The same with position interpolation.",
        "accuracy(PI, 8L) - accuracy(plain, 8L), learned seeds, long budget",
        _scaled_gain("pi", 8),
        stated=None,
    ),
)

PROPOSITIONS = PROPOSITIONS + RECALL_PROPOSITIONS


def check(results: dict, propositions=PROPOSITIONS) -> list[dict]:
    """One verdict per proposition for ``results`` (a :func:`run_all` output or its ``results``).

    Each verdict is a dict: ``name``, ``claim``, ``statistic``, ``values``
    (one per seed, in seed order), ``mean``, ``lo``, ``hi`` (the 95%
    t-interval over seeds), ``threshold``, ``verdict`` (``"holds"``,
    ``"fails"`` or ``"inconclusive"``, by the rule of the module doc),
    ``stated`` and ``seeds`` (how many values: a proposition about the seeds
    whose recall model learned the task counts those only).  A proposition
    whose rows are missing (an experiment not run) is left out.
    """
    res = results.get("results", results)
    seeds = sorted({r["seed"] for rows in res.values() for r in rows if "seed" in r}) or [None]
    out = []
    for p in propositions:
        try:
            values = [p.compute(res, s) for s in seeds]
        except KeyError:
            continue
        values = [round(float(v), 4) for v in values if v is not None]
        mean, lo, hi = t_interval(values) if values else (math.nan,) * 3
        if len(values) < 2 or any(math.isnan(v) for v in values):
            verdict = "inconclusive"
        elif lo > p.threshold:
            verdict = "holds"
        elif hi < p.threshold:
            verdict = "fails"
        else:
            verdict = "inconclusive"
        out.append(
            {
                "name": p.name,
                "claim": p.claim,
                "statistic": p.statistic,
                "values": values,
                "mean": round(mean, 4),
                "lo": round(lo, 4),
                "hi": round(hi, 4),
                "threshold": p.threshold,
                "verdict": verdict,
                "stated": p.stated,
                "seeds": len(values),
            }
        )
    return out


def failures(verdicts: list[dict]) -> list[dict]:
    """The verdicts of propositions stated as holding that do not hold."""
    return [v for v in verdicts if v["stated"] == "holds" and v["verdict"] != "holds"]


def format_verdicts(verdicts: list[dict]) -> str:
    """A plain-text table of verdicts, one line each."""
    lines = []
    for v in verdicts:
        lines.append(
            f"{v['verdict']:>12s}  {v['name']:28s} mean {v['mean']:+.3f} "
            f"[{v['lo']:+.3f}, {v['hi']:+.3f}] vs {v['threshold']:g}"
            f"{'  (stated: holds)' if v['stated'] == 'holds' else ''}"
        )
    return "\n".join(lines)
