"""The lab's experiments: each takes a :class:`~posenc.lab.Lab` and returns a tidy table.

Every experiment that applies to any scheme runs the schemes of the
configuration (``LabConfig.schemes``, by default every name in
:data:`posenc.SCHEMES`); ``rope_scaling`` (RoPE only) and ``injection``
(schemes that act on the input) keep their own selection, said in their docstrings.

A tidy table is a list of flat ``dict`` rows (one observation per row), with
floats rounded to 4 decimals so that stored results are small and stable.
:data:`EXPERIMENTS` names every experiment and :data:`DESCRIPTIONS` says in
one line what each asks; the experiments of this module come first, and
other modules add theirs here.
"""

from __future__ import annotations

import copy
import math

import torch

import posenc

from . import curves as _curves
from . import flipflop as _flipflop
from . import recall as _recall
from . import sweeps as _sweeps
from .lab import ROPE_METHODS, Lab, Row, loss_row, rope_scaling_for, rounded
from .model import TinyDecoder
from .patterns import LAYER_PATTERNS
from .train import evaluate_accuracy, seed_for, train

__all__ = [
    "DESCRIPTIONS", "EXPERIMENTS", "PRESET_EXPERIMENTS", "curse_batches", "curse_summary"
]  # fmt: skip


# ------------------------------------------------------------------ experiments


def training(lab: Lab) -> list[Row]:
    """Training-loss curves of the ``extrapolation`` models, with the floor at ``L``."""
    c = lab.config
    floor = lab.floor(c.train_len)
    rows: list[Row] = []
    for scheme in c.schemes:
        _, curve = lab.model("lm", scheme)
        for i, loss in enumerate(curve):
            step = min((i + 1) * 10, c.steps)
            rows.append(
                {"scheme": scheme, "step": step, "loss": rounded(loss), "floor": rounded(floor)}
            )
    return rows


def extrapolation(lab: Lab) -> list[Row]:
    """Loss at every evaluation length for every scheme trained at ``L``."""
    c = lab.config
    rows: list[Row] = []
    for scheme in c.schemes:
        model, _ = lab.model("lm", scheme)
        rows += [loss_row(lab, model, f, scheme=scheme) for f in c.eval_factors]
    return rows


def rope_scaling(lab: Lab) -> list[Row]:
    """RoPE context extension, at test time only and after a short fine-tune.

    Specific to ``rope``: the scalings (:data:`ROPE_METHODS`) change RoPE's
    frequencies, so this experiment trains the ``rope`` model whatever
    ``config.schemes`` holds.
    """
    base, _ = lab.model("lm", "rope")
    return _scaling_rows(lab, base)


def rope_budget(lab: Lab) -> list[Row]:
    """:func:`rope_scaling` for RoPE trained ``lm_long_steps`` steps instead of ``steps``.

    The model starts from the same initialisation, sees the same training data
    in the same order for its first ``steps`` steps and warms up over the same
    number of steps as the ``steps`` model: only the budget changes (and with
    it the cosine schedule's length).  Every row adds ``steps``.
    """
    c = lab.config
    base, _ = lab.model("lm", "rope", steps=c.lm_long_steps)
    return [{**r, "steps": c.lm_long_steps} for r in _scaling_rows(lab, base)]


def lm_budget(lab: Lab) -> list[Row]:
    """Language models of ``lm_budget_schemes`` trained with another budget.

    For each such scheme, the loss at every evaluation length of the model trained
    ``lm_long_steps`` steps, and of the model trained ``steps`` steps at the peak
    learning rate ``lr * s`` for each ``s`` of ``lm_lr_scales``.  Each starts from
    the ``extrapolation`` model's initialisation, sees its training data in the
    same order and warms up over the same steps, so each row pairs with that
    scheme's ``extrapolation`` row of the same seed and factor.  Fields:
    :func:`loss_row`'s, ``scheme``, ``steps`` and ``lr``.  No rows when
    ``lm_budget_schemes`` is empty.
    """
    c = lab.config
    rows: list[Row] = []
    variants = [{"steps": c.lm_long_steps}] + [{"lr": c.lr * s} for s in c.lm_lr_scales]
    for scheme in c.lm_budget_schemes:
        for variant in variants:
            model, _ = lab.model("lm", scheme, **variant)
            budget = {"steps": variant.get("steps", c.steps), "lr": variant.get("lr", c.lr)}
            rows += [loss_row(lab, model, f, scheme=scheme, **budget) for f in c.eval_factors]
    return rows


def _scaling_rows(lab: Lab, base: TinyDecoder) -> list[Row]:
    c = lab.config
    rows: list[Row] = []

    def row(method: str, finetuned: bool, scale: int, f: int) -> None:
        rows.append(loss_row(lab, model, f, method=method, finetuned=finetuned, scale=scale))

    for method in ROPE_METHODS:
        model = copy.deepcopy(base)
        for f in c.eval_factors:  # no fine-tune: the scale follows the length
            model.set_rope_scaling(rope_scaling_for(method, f, c.train_len))
            model.to(lab.device)
            row(method, False, f if method != "none" else 1, f)
    s = c.finetune_factor
    for method in ROPE_METHODS:
        model = copy.deepcopy(base)
        model.set_rope_scaling(rope_scaling_for(method, s, c.train_len))
        model.to(lab.device)
        train(
            model,
            lab.lm,
            length=s * c.train_len,
            steps=c.finetune_steps,
            batch=max(1, c.batch // s),
            lr=c.lr / 5,
            seed=seed_for(c.seed, "finetune", method),
            progress=lab.progress,
            desc=f"fine-tune rope {method}",
        )
        for f in sorted({1, s, 2 * s} | {f for f in c.eval_factors if f <= 2 * s}):
            row(method, True, s if method != "none" else 1, f)
    return rows


def curse_batches(lab: Lab, scheme: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """The windows ``early_tokens`` scores: ``(short, long)``, each window a fresh sample.

    Both come from the lab's language, ``lab.lm.source`` (a
    :class:`CopyVocabSource`), drawn with one :class:`torch.Generator` seeded
    by ``seed_for(config.seed, "curse")`` (the long windows first), so every
    scheme is scored on the same tokens.  Every window is a fresh sequence of
    its own length, never a piece cut from a longer stream: the source is not
    stationary (its first ``max(offsets)`` tokens are never copies), so a
    window cut at a multiple of ``L`` would start with the law of a mid-stream
    token, and its loss could sit below the entropy floor drawn for it.

    Parameters
    ----------
    lab
        The :class:`Lab` whose configuration sets the windows: ``L = train_len``,
        ``k = curse_factor`` and ``curse_sequences``.
    scheme
        Ignored: the windows depend on the configuration only, the same for
        every scheme.

    Returns
    -------
    ``(short, long)``, int64 token ids: ``short`` is ``(k * curse_sequences, L + 1)``
    and ``long`` is ``(curse_sequences, k L + 1)``.  Each row holds a window's
    inputs and, shifted by one, its next-token targets, so both predict the same
    number of tokens, ``k L curse_sequences``.
    """
    c = lab.config
    k, n = c.curse_factor, c.curse_factor * c.train_len
    gen = torch.Generator().manual_seed(seed_for(c.seed, "curse"))
    long_ = lab.lm.source.sample(c.curse_sequences, n + 1, gen)
    short = lab.lm.source.sample(k * c.curse_sequences, c.train_len + 1, gen)
    return short, long_


def early_tokens(lab: Lab) -> list[Row]:
    """Loss by position inside the window: ``L``-long windows against windows ``k L`` long.

    The same number of tokens (``curse_sequences`` windows of ``k L``,
    ``k = curse_factor``, or ``k`` times as many windows of ``L``; see
    :func:`curse_batches`) is scored both ways.  ``position`` is the position
    inside the window; ``floor`` is the source's entropy there, which is
    the law of both kinds of window.  Every scheme of ``config.schemes`` is scored.
    """
    c = lab.config
    n = c.curse_factor * c.train_len
    floor = lab.lm.floor(n)
    rows: list[Row] = []
    short, long_ = curse_batches(lab)
    for scheme in c.schemes:
        model, _ = lab.model("lm", scheme)
        with torch.no_grad():
            for window, tokens in (("short", short), ("long", long_)):
                length = tokens.shape[1] - 1
                total = torch.zeros(length, dtype=torch.float64)
                for start in range(0, len(tokens), 32):  # 32 windows at a time: bounded memory
                    chunk = tokens[start : start + 32].to(lab.device)
                    x, y = chunk[:, :-1], chunk[:, 1:]
                    ce = torch.nn.functional.cross_entropy(
                        model(x).transpose(1, 2), y, reduction="none"
                    )
                    total += ce.to("cpu", torch.float64).sum(0)
                per_pos = total / len(tokens)
                for p in range(length):
                    rows.append(
                        {
                            "scheme": scheme,
                            "window": window,
                            "position": p,
                            "loss": rounded(per_pos[p]),
                            "floor": rounded(floor[p]),
                        }
                    )
    return rows


def curse_summary(rows: list[Row], tail: int = 8) -> list[Row]:
    """How much of the long window's gain the early-token curse alone explains.

    Per seed (when rows carry one) and scheme, from the per-position losses
    of the two windowings: ``short`` and ``long`` are their means over
    positions; ``curse_only`` is the long window's mean loss if every position
    from ``L`` on scored the mean of the last ``tail`` positions of a short
    window (no use of context beyond ``L``); ``gain = short - long``; and
    ``explained`` is ``rho = (short - curse_only) / gain``.  The same numbers
    for the entropy floor (``scheme="floor"``) show what an ideal model would gain.

    Parameters
    ----------
    rows
        Rows of ``early_tokens``: ``scheme``, ``window`` (``"short"`` or
        ``"long"``), ``position``, ``loss`` and ``floor``, and ``seed`` when
        they come from :func:`run_all`; each scheme's rows in order of
        position.  ``L`` is the number of short-window rows of a scheme.
    tail
        How many of the last short-window positions stand for a position with
        a full window of context (default 8; at most ``L``).

    Returns
    -------
    One row per seed (in the order they first appear) and scheme (sorted,
    then ``"floor"``, computed from the first scheme's ``floor`` column):
    ``seed`` (only when the rows carry one), ``scheme``, ``short``, ``long``,
    ``curse_only``, ``gain`` (mean losses, nats per token) and ``explained``
    (``None`` when ``gain <= 0``), floats rounded to 4 decimals.
    """
    out: list[Row] = []
    for seed in dict.fromkeys(r.get("seed") for r in rows):
        mine = [r for r in rows if r.get("seed") == seed]
        schemes = sorted({r["scheme"] for r in mine})
        for scheme in schemes + ["floor"]:
            src = schemes[0] if scheme == "floor" else scheme
            key = "floor" if scheme == "floor" else "loss"
            short = [r[key] for r in mine if r["scheme"] == src and r["window"] == "short"]
            long_ = [r[key] for r in mine if r["scheme"] == src and r["window"] == "long"]
            L, n = len(short), len(long_)
            s_mean, l_mean = math.fsum(short) / L, math.fsum(long_) / n
            t_mean = math.fsum(short[-tail:]) / tail
            curse_only = (math.fsum(short) + (n - L) * t_mean) / n
            gain = s_mean - l_mean
            row: Row = {} if seed is None else {"seed": seed}
            out.append(
                {
                    **row,
                    "scheme": scheme,
                    "short": rounded(s_mean),
                    "long": rounded(l_mean),
                    "curse_only": rounded(curse_only),
                    "gain": rounded(gain),
                    "explained": rounded((s_mean - curse_only) / gain) if gain > 0 else None,
                }
            )
    return out


def passkey(lab: Lab) -> list[Row]:
    """Retrieval accuracy by distance band, at ``L`` and at ``passkey_factor * L``.

    Every scheme of ``config.retrieval_schemes`` (``passkey_schemes``, by default
    the same as ``schemes``) is trained on the retrieval task; when ``rope`` is
    among them, the RoPE model is also evaluated with each scaling of
    :data:`ROPE_METHODS` at factor ``passkey_factor`` (rows ``rope:<method>``).
    """
    c = lab.config
    L, n = c.train_len, c.passkey_factor * c.train_len
    bands = [(1, L - 1)]
    lo = L
    while lo <= n - 1:
        bands.append((lo, min(2 * lo - 1, n - 1)))
        lo *= 2
    rows: list[Row] = []
    for scheme in c.retrieval_schemes:
        model, _ = lab.model("passkey", scheme)
        for length, band in [(L, (1, L - 1))] + [(n, b) for b in bands]:
            acc = evaluate_accuracy(
                model,
                lab.retrieval,
                length,
                band,
                sequences=c.passkey_sequences,
                seed=seed_for(c.seed, "passkey-eval", length, band),
            )
            rows.append(
                {
                    "scheme": scheme,
                    "length": length,
                    "lo": band[0],
                    "hi": band[1],
                    "accuracy": rounded(acc),
                }
            )
    if "rope" in c.retrieval_schemes:  # the RoPE model with each scaling at factor n / L
        for method in ROPE_METHODS[1:]:
            model = copy.deepcopy(lab.model("passkey", "rope")[0])
            model.set_rope_scaling(rope_scaling_for(method, c.passkey_factor, L))
            model.to(lab.device)
            for band in bands:
                acc = evaluate_accuracy(
                    model,
                    lab.retrieval,
                    n,
                    band,
                    sequences=c.passkey_sequences,
                    seed=seed_for(c.seed, "passkey-eval", n, band),
                )
                rows.append(
                    {"scheme": f"rope:{method}", "length": n, "lo": band[0], "hi": band[1],
                     "accuracy": rounded(acc)}
                )  # fmt: skip
    return rows


def injection(lab: Lab) -> list[Row]:
    """Input tables added at the input only or to every layer's input.

    Specific to the schemes that act on the input (``acts_on == "input"`` in
    :data:`posenc.SCHEMES`: ``sinusoidal`` and ``learned``): only they can be
    injected in two ways.  Every such scheme of ``config.schemes`` is run.
    """
    c = lab.config
    rows: list[Row] = []
    for scheme in [s for s in c.schemes if posenc.SCHEMES[s].acts_on == "input"]:
        for inject in ("input", "every"):
            model, curve = lab.model("lm", scheme, inject)
            for f in sorted({1, 2} & set(c.eval_factors)) or [1]:
                row = loss_row(lab, model, f, scheme=scheme, inject=inject)
                rows.append({**row, "final_train_loss": rounded(curve[-1])})
    return rows


#: Every experiment of the lab, ``{name: function}``: each function takes a :class:`Lab`
#: and returns its tidy table (a list of flat ``dict`` rows).  The seven of this module,
#: then those of :mod:`posenc.lab.curves`, :mod:`posenc.lab.sweeps`,
#: :mod:`posenc.lab.recall` and :mod:`posenc.lab.flipflop`, in the order the chapter
#: shows them; :data:`DESCRIPTIONS` says in one line what each asks, and
#: :func:`run_all` runs them by name.
EXPERIMENTS = {
    "training": training,
    "extrapolation": extrapolation,
    "rope_scaling": rope_scaling,
    "rope_budget": rope_budget,
    "lm_budget": lm_budget,
    "early_tokens": early_tokens,
    "passkey": passkey,
    "injection": injection,
}

#: One line per experiment (``python -m posenc.lab --help`` lists them).
DESCRIPTIONS = {
    "training": "training-loss curves of every scheme at L, against the entropy floor",
    "extrapolation": "loss above the floor at L, 2L, 4L, 8L, 16L for every scheme trained at L",
    "rope_scaling": "RoPE with PI, NTK, YaRN, Llama 3.1 at test time, and after a short "
    "fine-tune (plain RoPE fine-tuned: the control)",
    "rope_budget": "rope_scaling for RoPE trained lm_long_steps (1200) steps, same initialisation, "
    "data and warmup",
    "lm_budget": "extrapolation for lm_budget_schemes trained lm_long_steps steps, and at "
    "lr x each lm_lr_scales, same initialisation, data and warmup (when they are set)",
    "early_tokens": "loss by position in fresh L-long windows against fresh 4L-long ones, "
    "every scheme",
    "passkey": "retrieval accuracy by distance band at L and 8L (RoPE also with its scalings)",
    "injection": "input tables (sinusoidal, learned) at the input only or in every layer",
}

# the experiments of the other modules, in the order the chapter shows them
for _module in (_curves, _sweeps, _recall, _flipflop):
    EXPERIMENTS.update(_module.EXPERIMENTS)
    DESCRIPTIONS.update(_module.DESCRIPTIONS)

#: What each preset runs by default (``python -m posenc.lab --preset P``): the
#: recall task needs a longer training budget, so it is a preset of its own, and so is
#: flip-flop language modelling, whose model has its own shape.
# Experiments that score nothing unless a preset sets their fields (LabConfig.recall_lead,
# lm_budget_schemes): left out of the stored runs' presets, so a re-run holds the
# experiments the stored run ran
OPT_IN = ("recall_lead", "lm_budget")
RECALL_EXPERIMENTS = tuple(n for n in _recall.EXPERIMENTS if n not in OPT_IN)
FFLM_EXPERIMENTS = tuple(_flipflop.EXPERIMENTS)
PRESET_EXPERIMENTS = {
    "full": tuple(
        n for n in EXPERIMENTS if n not in (*_recall.EXPERIMENTS, *FFLM_EXPERIMENTS, *OPT_IN)
    ),
    "recall": RECALL_EXPERIMENTS,
    "recall-warmup": RECALL_EXPERIMENTS,
    "fflm": FFLM_EXPERIMENTS,
    "fflm-length": FFLM_EXPERIMENTS,
    "smoke": tuple(EXPERIMENTS),
    # the fourth freeze (posenc.lab.recipe_propositions): recall under one recipe, with
    # the far bands moved from the input's start; the language models' budgets
    "recall-recipe": (*RECALL_EXPERIMENTS, "recall_lead"),
    "lm-budget": ("extrapolation", "lm_budget"),
    # the layer patterns of 2025's models and their 4-layer baselines: the recall task
    **{name: RECALL_EXPERIMENTS for name in (*LAYER_PATTERNS, "baseline-4l")},
    # ... and on the flip-flop length axis
    **{f"fflm-length-{n}": FFLM_EXPERIMENTS for n in (*LAYER_PATTERNS, "4l")},
}
