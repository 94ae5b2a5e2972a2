"""Figures of the lab's results (matplotlib, imported when called).

Each function takes the ``results`` mapping of :func:`posenc.lab.run_all`
(``output["results"]``, one row per seed) and returns a
:class:`matplotlib.figure.Figure`.  A loss is shown as the mean over seeds with
its 95% t-interval (:func:`posenc.lab.summarize`) as a band or error bar; an
accuracy as every seed, or as the answers of every seed pooled with a
Clopper-Pearson interval (:func:`passkey`, which also takes the answer count).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .run import summarize

__all__ = ["FIGURES"]


def _plt():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "posenc.lab.plots needs matplotlib: pip install matplotlib (or posenc[lab])"
        ) from None
    return plt


def _pick(rows, **keys):
    return [r for r in rows if all(r[k] == v for k, v in keys.items())]


def _band(ax, rows, x, y, label=None, **kw):
    xs = [r[x] for r in rows]
    (line,) = ax.plot(xs, [r[y] for r in rows], label=label, **kw)
    ax.fill_between(
        xs, [r[f"{y}_lo"] for r in rows], [r[f"{y}_hi"] for r in rows], color=line.get_color(),
        alpha=0.2, lw=0,
    )  # fmt: skip
    return line


def _seeds(rows):
    """How many seeds the rows hold, per scheme: ``"5"``, or ``"5-10"`` when schemes differ."""
    per: dict = {}
    for r in rows:
        per.setdefault(r.get("scheme", "").split(":")[0], set()).add(r.get("seed"))
    counts = sorted({len(v) for v in per.values()}) or [0]
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def _many(ax, count):
    """Distinct colours for up to 20 lines (the default cycle repeats after 10)."""
    if count > 10:
        import matplotlib

        ax.set_prop_cycle(color=matplotlib.colormaps["tab20"].colors)


def training(results):
    plt = _plt()
    rows = summarize(results["training"])
    fig, ax = plt.subplots(figsize=(7, 4))
    _many(ax, len({r["scheme"] for r in rows}))
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        _band(ax, _pick(rows, scheme=scheme), "step", "loss", label=scheme, lw=1.2)
    ax.axhline(rows[0]["floor"], color="k", ls="--", label="entropy floor")
    ax.set(
        xlabel="step",
        ylabel="training loss (nats/token)",
        title=f"Training at length L (mean of {_seeds(results['training'])} seeds, 95% band)",
    )
    ax.legend(ncol=2, fontsize=9)
    fig.tight_layout()
    return fig


def _excess_bars(ax, rows, *, shift=1.0, **style):
    """Error bars of the loss above the floor (95% t) by evaluation factor, moved sideways
    by the factor ``shift`` so that several series stay apart."""
    ax.errorbar(
        [r["factor"] * shift for r in rows], [r["excess"] for r in rows],
        yerr=[[r["excess"] - r["excess_lo"] for r in rows],
              [r["excess_hi"] - r["excess"] for r in rows]],
        marker="o", ms=4, capsize=2, **style,
    )  # fmt: skip


def extrapolation(results):
    plt = _plt()
    rows = summarize(results["extrapolation"])
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    _many(ax, len(schemes))
    for i, scheme in enumerate(schemes):
        shift = 2 ** ((i - len(schemes) / 2) * 0.02)  # spread the error bars sideways
        _excess_bars(ax, _pick(rows, scheme=scheme), shift=shift, label=scheme)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(
        xlabel="evaluation length / training length",
        ylabel="loss above the entropy floor (nats)",
        title=f"Train short, test long ({_seeds(results['extrapolation'])} seeds, 95% t-interval)",
    )
    ax.legend(ncol=3, fontsize=9)
    fig.tight_layout()
    return fig


def rope_scaling(results, name="rope_scaling"):
    plt = _plt()
    rows = summarize(results[name])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, tuned in zip(axes, (False, True), strict=True):
        for method in dict.fromkeys(r["method"] for r in rows):
            _band(ax, _pick(rows, method=method, finetuned=tuned), "factor", "excess",
                  label=method, marker="o", ms=3)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set(
            xlabel="evaluation length / training length",
            title="after a short fine-tune at 4L" if tuned else "no fine-tune (scale = length / L)",
        )
    axes[0].set_yscale("log")
    axes[0].set_ylabel("loss above the entropy floor (nats)")
    axes[0].legend(fontsize=9)
    if name != "rope_scaling":
        steps = sorted({r["steps"] for r in results[name]})
        fig.suptitle(f"RoPE trained {', '.join(map(str, steps))} steps", fontsize=10)
    fig.tight_layout()
    return fig


def rope_budget(results):
    """:func:`rope_scaling` for the RoPE model of the second budget (``rope_budget`` rows)."""
    return rope_scaling(results, "rope_budget")


def lm_budget(results):
    """Loss above the floor by evaluation length, one panel per scheme: its
    ``extrapolation`` model (when stored) beside the same model at each other budget."""
    plt = _plt()
    rows = summarize(results["lm_budget"])
    base = summarize(results["extrapolation"]) if results.get("extrapolation") else []
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    budgets = list(dict.fromkeys((r["steps"], r["lr"]) for r in rows))
    cols = min(4, len(schemes))
    nrows = -(-len(schemes) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(10, 1 + 2.6 * nrows), sharey=True,
                             squeeze=False)  # fmt: skip
    for ax in axes.flat[len(schemes) :]:
        ax.set_visible(False)
    for ax, scheme in zip(axes.flat, schemes, strict=False):
        if own := _pick(base, scheme=scheme):
            _excess_bars(ax, own, label="the extrapolation model")
        for i, (steps, lr) in enumerate(budgets, 1):
            _excess_bars(ax, _pick(rows, scheme=scheme, steps=steps, lr=lr),
                         shift=2 ** (0.04 * i), label=f"{steps} steps, lr {lr:.2g}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set(title=scheme, xlabel="length / L")
    for ax in axes[:, 0]:
        ax.set_ylabel("loss above floor (nats)")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"Other budgets ({_seeds(results['lm_budget'])} seeds, 95% t-interval)",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig


def early_tokens(results):
    plt = _plt()
    rows = summarize(results["early_tokens"])
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    cols = min(4, len(schemes))  # one panel per scheme, four to a row
    nrows = -(-len(schemes) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(10, 1 + 3 * nrows), sharey=True, squeeze=False)
    for ax in axes.flat[len(schemes) :]:
        ax.set_visible(False)
    for ax, scheme in zip(axes.flat, schemes, strict=False):
        for window in ("short", "long"):
            _band(ax, _pick(rows, scheme=scheme, window=window), "position", "loss",
                  label=f"{window} window")  # fmt: skip
        rs = _pick(rows, scheme=scheme, window="long")
        ax.plot([r["position"] for r in rs], [r["floor"] for r in rs], "k--", label="floor")
        ax.set(xlabel="position inside the window", title=scheme)
    for ax in axes[:, 0]:
        ax.set_ylabel("loss (nats)")
    axes[0, 0].legend(fontsize=9)
    fig.tight_layout()
    return fig


def _answers(rows, sequences):
    """``(correct, answers)`` pooled over ``rows``, each an accuracy over ``sequences``
    answers; refuses a count that does not make every accuracy a whole number of answers
    (the rows store the accuracy to 4 decimals, which pins the count down for up to
    5,000 answers)."""
    correct = 0
    for r in rows:
        k = r["accuracy"] * sequences
        if abs(k - round(k)) > 0.5e-4 * sequences + 1e-9:  # 4 decimals' rounding
            raise ValueError(
                f"sequences={sequences} does not fit the stored accuracy {r['accuracy']} "
                f"(seed {r.get('seed')}): pass the run's config.passkey_sequences"
            )
        correct += round(k)
    return correct, sequences * len(rows)


def passkey(results, sequences):
    """One panel per scheme (the curves sit on top of each other in a single panel).

    ``sequences`` is the run's ``config.passkey_sequences``: the answers behind
    each stored accuracy.  A curve is the accuracy of every answer of every seed
    with its 95% Clopper-Pearson interval (the answers' uncertainty, given the
    trained models); dots are the seeds, which show how much the models differ.
    """
    from .stats import clopper_pearson

    plt = _plt()
    rows = results["passkey"]
    long_len = max(r["length"] for r in rows)
    train_len = min(r["length"] for r in rows)
    base = [s for s in dict.fromkeys(r["scheme"] for r in rows) if ":" not in s]
    cols = 3
    nrows = -(-len(base) // cols)
    fig, axes = plt.subplots(
        nrows, cols, figsize=(10, 0.5 + 2.5 * nrows), sharex=True, sharey=True, squeeze=False
    )
    for ax in axes.flat[len(base) :]:
        ax.set_visible(False)
    for ax, scheme in zip(axes.flat, base, strict=False):
        names = [scheme] + sorted(
            {r["scheme"] for r in rows if r["scheme"].startswith(scheme + ":")}
        )
        for name in names:
            his = sorted({r["hi"] for r in _pick(rows, scheme=name, length=long_len)})
            pooled = [_answers(_pick(rows, scheme=name, length=long_len, hi=hi), sequences)
                      for hi in his]  # fmt: skip
            acc = [k / n for k, n in pooled]
            cp = [clopper_pearson(k, n) for k, n in pooled]
            line = ax.errorbar(
                his, acc, yerr=[[a - lo for a, (lo, _) in zip(acc, cp, strict=True)],
                                [hi - a for a, (_, hi) in zip(acc, cp, strict=True)]],
                marker="o", ms=3, capsize=2, label=name.split(":")[-1] if ":" in name else "plain",
            )  # fmt: skip
            seeds = _pick(rows, scheme=name, length=long_len)
            ax.scatter([r["hi"] for r in seeds], [r["accuracy"] for r in seeds], s=5,
                       color=line.lines[0].get_color(), alpha=0.4, lw=0)  # fmt: skip
        ax.axvline(train_len, color="k", ls=":")
        ax.axhline(1 / 8, color="gray", ls="--")
        ax.set_xscale("log", base=2)
        ax.set(title=scheme, ylim=(-0.05, 1.1))
        if len(names) > 1:
            ax.legend(fontsize=8, ncol=2, loc="lower left")
    for col in range(cols):  # the lowest panel of each column carries the x axis
        for ax in [a for a in axes[:, col] if a.get_visible()][-1:]:
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel("distance band (upper edge)")
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy")
    fig.suptitle(
        f"Passkey retrieval in inputs of {long_len}, {_seeds(rows)} seeds of {sequences} "
        "answers\n(lines: all answers, 95% Clopper-Pearson; dots: seeds; dotted: L; "
        "dashed: chance)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def injection(results):
    """The per-seed difference input-only minus every-layer, with its interval."""
    plt = _plt()
    raw = results["injection"]
    diffs = []
    for r in raw:
        if r["inject"] == "input":
            other = _pick(raw, seed=r.get("seed"), scheme=r["scheme"], inject="every",
                          factor=r["factor"])[0]  # fmt: skip
            diffs.append({"seed": r.get("seed"), "scheme": r["scheme"], "factor": r["factor"],
                          "diff": r["excess"] - other["excess"]})  # fmt: skip
    rows = summarize(diffs)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = []
    for i, r in enumerate(rows):
        ax.errorbar([r["diff"]], [i], xerr=[[r["diff"] - r["diff_lo"]], [r["diff_hi"] - r["diff"]]],
                    fmt="o", color="tab:blue", capsize=3)  # fmt: skip
        seeds = [d["diff"] for d in _pick(diffs, scheme=r["scheme"], factor=r["factor"])]
        ax.plot(seeds, [i + 0.15] * len(seeds), "x", color="gray", ms=5)
        labels.append(f"{r['scheme']} at {r['factor']}L")
    ax.axvline(0, color="k", lw=1)
    ax.set_yticks(range(len(rows)), labels, fontsize=11)
    ax.set(
        xlabel="excess loss, input only minus every layer (nats; > 0: every layer better)",
        title="Position at the input or in every layer (x: single seeds)",
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ the later experiments


def _summary(rows, *keys):
    """:func:`summarize` grouped also by ``keys``: fields like ``base`` or ``depth`` are
    floats, which ``summarize`` would average over instead of keeping apart."""
    out = []
    for values in dict.fromkeys(tuple(r[k] for k in keys) for r in rows):
        group = [r for r in rows if tuple(r[k] for k in keys) == values]
        out += [{**s, **dict(zip(keys, values, strict=True))} for s in summarize(group)]
    return out


def _grid(plt, count, cols, width, height, **kw):
    """``count`` panels, ``cols`` to a row; unused panels hidden: ``(fig, axes)``, axes 2-D."""
    cols = min(cols, count)
    nrows = -(-count // cols)
    fig, axes = plt.subplots(
        nrows, cols, figsize=(width, 0.6 + height * nrows), squeeze=False, **kw
    )
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, axes


def _above_floor(rows, *keys):
    """Per-seed ``loss - floor`` as ``gap``, summarized (grouped also by ``keys``)."""
    return _summary([{**r, "gap": r["loss"] - r["floor"]} for r in rows], *keys)


def _log_if_wide(ax, rows, y):
    """A log y axis when the band spans more than a decade (and stays above 0)."""
    lo, hi = min(r[f"{y}_lo"] for r in rows), max(r[f"{y}_hi"] for r in rows)
    if lo > 0 and hi > 10 * lo:
        ax.set_yscale("log")


def positions(results):
    """Loss by position in the context, one panel per evaluation length."""
    plt = _plt()
    raw = results["positions"]
    rows = summarize(raw)
    train_len = min(r["length"] for r in rows)
    factors = sorted({r["factor"] for r in rows})
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    fig, axes = _grid(plt, len(factors), 3, 11, 3.2, sharey=True)
    for ax, f in zip(axes.flat, factors, strict=False):
        _many(ax, len(schemes))
        for scheme in schemes:
            _band(ax, _pick(rows, scheme=scheme, factor=f), "start", "loss", label=scheme, lw=1.2)
        rs = _pick(rows, scheme=schemes[0], factor=f)
        ax.plot([r["start"] for r in rs], [r["floor"] for r in rs], "k--", label="entropy floor")
        ax.axvline(train_len, color="k", ls=":", lw=1)
        ax.set(
            title=f"inputs of {_context(f)} = {f * train_len}",
            xlabel="position (start of its bin)",
        )
    for ax in axes[:, 0]:
        ax.set_ylabel("loss (nats/token)")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="center right", fontsize=8)
    fig.suptitle(
        f"Loss by position (dotted: L; mean of {_seeds(raw)} seeds, 95% band)", fontsize=11
    )
    fig.tight_layout(rect=(0, 0, 0.85, 1))  # room for the legend on the right
    return fig


def sliding(results):
    """Loss above the floor, non-overlapping windows (solid) against a sliding window (dashed)."""
    plt = _plt()
    raw = results["sliding"]
    rows = _above_floor(raw)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    _many(ax, len({r["scheme"] for r in rows}))
    colours = {}
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        for window, ls in (("nonoverlapping", "-"), ("sliding", "--")):
            line = _band(ax, _pick(rows, scheme=scheme, window=window), "length", "gap",
                         color=colours.get(scheme), ls=ls, marker="o", ms=3)  # fmt: skip
            colours[scheme] = line.get_color()
    handles = [plt.Line2D([], [], color=c, label=s) for s, c in colours.items()]
    handles += [plt.Line2D([], [], color="k", ls=ls, label=w)
                for w, ls in (("non-overlapping", "-"), ("sliding", "--"))]  # fmt: skip
    ax.set_xscale("log", base=2)
    _log_if_wide(ax, rows, "gap")
    ax.set(
        xlabel="evaluation window (tokens)",
        ylabel="loss above the entropy floor (nats)",
        title=f"Windows over the same streams (mean of {_seeds(raw)} seeds, 95% band)",
    )
    ax.legend(handles=handles, ncol=2, fontsize=8)
    fig.tight_layout()
    return fig


def _bars(ax, rows, groups, members, key, label):
    """Grouped bars of ``excess`` with 95% error bars: one group per ``groups`` value."""
    width = 0.8 / len(members)
    for j, m in enumerate(members):
        rs = [_pick(rows, **{key: g, label: m}) for g in groups]
        xs = [i + (j - (len(members) - 1) / 2) * width for i, r in enumerate(rs) if r]
        rs = [r[0] for r in rs if r]
        ax.bar(
            xs, [r["excess"] for r in rs], width,
            yerr=[[r["excess"] - r["excess_lo"] for r in rs],
                  [r["excess_hi"] - r["excess"] for r in rs]],
            capsize=2, label=m,
        )  # fmt: skip


def rope_base(results):
    """Per head dimension: plain RoPE's excess by length per base, and NTK against YaRN."""
    plt = _plt()
    raw = results["rope_base"]
    rows = _summary(raw, "base")
    dims = sorted({r["head_dim"] for r in rows})
    bases = sorted({r["base"] for r in rows})
    factors = sorted({r["factor"] for r in rows if r["factor"] > 1})
    at = 4 if 4 in factors else max(factors, default=1)
    fig, axes = plt.subplots(len(dims), 2, figsize=(10, 0.6 + 3.2 * len(dims)), squeeze=False)
    for (left, right), dim in zip(axes, dims, strict=True):
        for base in bases:
            _band(left, _pick(rows, head_dim=dim, base=base, method="none"), "length", "excess",
                  label=f"base {base:g}", marker="o", ms=3)  # fmt: skip
        left.set_xscale("log", base=2)
        left.set(xlabel="evaluation length (tokens)", ylabel="excess loss (nats)",
                 title=f"plain RoPE, head dim {dim}")  # fmt: skip
        left.legend(fontsize=8)
        _bars(right, _pick(rows, head_dim=dim, factor=at), bases, ("ntk", "yarn"), "base", "method")
        right.set_xticks(range(len(bases)), [f"{b:g}" for b in bases])
        right.set(xlabel="RoPE base", ylabel="excess loss (nats)",
                  title=f"NTK and YaRN at {at}L, head dim {dim}")  # fmt: skip
        right.legend(fontsize=8)
    fig.suptitle(
        f"RoPE base and head dimension (mean of {_seeds(raw)} seeds, 95% band / error bar)",
        fontsize=11,
    )
    fig.tight_layout()
    return fig


def alibi_slopes(results):
    """ALiBi's excess loss by length, one line per slope scale."""
    plt = _plt()
    raw = results["alibi_slopes"]
    rows = _summary(raw, "scale")
    fig, ax = plt.subplots(figsize=(7, 4))
    for scale in sorted({r["scale"] for r in rows}):
        _band(ax, _pick(rows, scale=scale), "length", "excess", label=f"slopes x {scale:g}",
              marker="o", ms=3)  # fmt: skip
    ax.set_xscale("log", base=2)
    _log_if_wide(ax, rows, "excess")
    ax.set(
        xlabel="evaluation length (tokens)",
        ylabel="loss above the entropy floor (nats)",
        title=f"ALiBi slope scale (mean of {_seeds(raw)} seeds, 95% band)",
    )
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


def yarn_sweep(results):
    """YaRN's excess loss by length for each ``beta_fast``, NTK beside it.

    Error bars rather than bands, spread sideways: several ``beta_fast`` can
    give the same scaling (``posenc.lab.sweeps.yarn_split``), and their
    curves would hide each other."""
    plt = _plt()
    raw = results["yarn_sweep"]
    rows = _summary(raw, "method", "beta_fast")
    variants = list(dict.fromkeys((r["method"], r["beta_fast"]) for r in rows))
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (method, beta) in enumerate(variants):
        rs = _pick(rows, method=method, beta_fast=beta)
        shift = 2 ** ((i - (len(variants) - 1) / 2) * 0.03)
        ax.errorbar(
            [r["length"] * shift for r in rs], [r["excess"] for r in rs],
            yerr=[[r["excess"] - r["excess_lo"] for r in rs],
                  [r["excess_hi"] - r["excess"] for r in rs]],
            marker="o", ms=4, capsize=2, ls="--" if method == "ntk" else "-",
            label="NTK" if method == "ntk" else f"YaRN, beta_fast {beta:g}",
        )  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set(
        xlabel="evaluation length (tokens)",
        ylabel="loss above the entropy floor (nats)",
        title=f"YaRN's beta_fast at test time ({_seeds(raw)} seeds, 95% t-interval)",
    )
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


def _context(factor):
    return "L, in view" if factor == 0 else ("L" if factor == 1 else f"{factor}L")


def _slot(row):
    return f"{_context(row['factor'])}: {row['band']}"


def recall(results):
    """Recall accuracy by context and distance band, every seed, one panel per model.

    Filled points: full attention, filled where that seed's model learned the
    task in view; crosses: the same model with attention limited to its last L
    keys (the control); bars: the median over seeds of each.  ``rope:<method>``
    (RoPE with a scaling at test time) has a panel of its own."""
    plt = _plt()
    raw = [r for r in results["recall"] if r["factor"] > 0]
    learned = {(r["scheme"], r["seed"]): r["learned"] == 1 for r in results["recall"]
               if r["factor"] == 0}  # fmt: skip
    names = list(dict.fromkeys(r["scheme"] for r in raw))
    slots = list(dict.fromkeys(_slot(r) for r in sorted(raw, key=lambda r: (r["factor"], r["lo"]))))
    seeds = list(dict.fromkeys(r["seed"] for r in raw))
    fig, axes = _grid(plt, len(names), 3, 13, 2.7, sharey=True)
    for ax, name in zip(axes.flat, names, strict=False):
        base = name.split(":")[0]
        for x, slot in enumerate(slots):
            for attention, dx in (("full", -0.15), ("window", 0.15)):
                rows = [r for r in raw if r["scheme"] == name and _slot(r) == slot
                        and r["attention"] == attention]  # fmt: skip
                if not rows:
                    continue
                for r in rows:
                    good = learned.get((base, r["seed"]), False)
                    k = seeds.index(r["seed"])
                    jitter = (k - (len(seeds) - 1) / 2) * 0.2 / max(1, len(seeds))
                    if attention == "full":
                        ax.scatter(
                            [x + dx + jitter],
                            [r["accuracy"]],
                            s=14,
                            zorder=3,
                            edgecolors="C0",
                            facecolors="C0" if good else "none",
                        )
                    else:
                        ax.scatter([x + dx + jitter], [r["accuracy"]], s=14, zorder=3,
                                   marker="x", color="C3", lw=0.8, label="_window")  # fmt: skip
                accs = sorted(r["accuracy"] for r in rows)
                median = (accs[(len(accs) - 1) // 2] + accs[len(accs) // 2]) / 2
                ax.plot([x + dx - 0.12, x + dx + 0.12], [median] * 2,
                        color="C0" if attention == "full" else "C3", lw=2)  # fmt: skip
        ax.axhline(raw[0]["chance"], color="gray", ls="--", lw=1)
        ax.set_xticks(range(len(slots)), slots, rotation=60, fontsize=7)
        own = [s for b, s in learned if b == base]  # parts run apart may hold other seeds
        got = sum(learned[base, s] for s in own)
        ax.set(title=f"{name} ({got} of {len(own)} seeds learned)", ylim=(-0.05, 1.05),
               yticks=[0, 0.5, 1])  # fmt: skip
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy")
    fig.suptitle(
        "Recall by context: distance band (circles: full attention, filled if the model "
        "learned; crosses: attention limited to the last L keys; bars: medians; dashed: chance)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))  # room for the title
    return fig


def recall_answers(results):
    """How far back the scored keys lie: the distances of every band, at each context."""
    plt = _plt()
    rows = results["recall_answers"]
    factors = sorted({r["factor"] for r in rows})
    fig, axes = _grid(plt, len(factors), 4, 12, 2.6, sharey=True)
    for ax, f in zip(axes.flat, factors, strict=False):
        for r in dict((r["band"], r) for r in rows if r["factor"] == f).values():
            ds = [d for x in rows if x["factor"] == f and x["band"] == r["band"]
                  for d in x["distances"]]  # fmt: skip
            xs = list(range(min(ds), max(ds) + 1))
            counts = [0] * len(xs)
            for d in ds:
                counts[d - xs[0]] += 1
            ax.step(xs, counts, where="mid", label=r["band"], lw=1)
        ax.set(title=f"context {_context(f)}", xlabel="query position minus key position")
        ax.legend(fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("answers")
    fig.tight_layout()
    return fig


def recall_curve(results):
    """In-view recall accuracy during training, every seed, one panel per scheme."""
    plt = _plt()
    rows = results["recall_curve"]
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    fig, axes = _grid(plt, len(schemes), 4, 13, 2.4, sharey=True, sharex=True)
    for ax, scheme in zip(axes.flat, schemes, strict=False):
        for seed in dict.fromkeys(r["seed"] for r in rows):
            rs = _pick(rows, scheme=scheme, seed=seed)
            ax.plot([r["step"] for r in rs], [r["accuracy_round1"] for r in rs], lw=0.9,
                    color="C0", alpha=0.8)  # fmt: skip
            ax.plot([r["step"] for r in rs], [r["accuracy_round2"] for r in rs], lw=0.9,
                    color="C1", alpha=0.6, ls=":")  # fmt: skip
        ax.set(title=scheme, ylim=(-0.05, 1.05))
    for ax in axes[-1, :]:
        ax.set_xlabel("training step")
    for ax in axes[:, 0]:
        ax.set_ylabel("in-view accuracy")
    fig.suptitle("In-view recall during training, each seed (solid: first query round; "
                 "dotted: second round)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig


def fflm(results):
    """Flip-flop read errors by evaluation length, one panel per split (in-distribution,
    sparse, dense): every scheme's error rate pooled over its seeds' reads, and each seed."""
    plt = _plt()
    rows = results["fflm"]
    splits = list(dict.fromkeys(r["eval"] for r in rows))
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    fig, axes = _grid(plt, len(splits), 3, 13, 3.0, sharey=True)
    for ax, split in zip(axes.flat, splits, strict=False):
        _many(ax, len(schemes))
        for scheme in schemes:
            rs = _pick(rows, scheme=scheme, eval=split)
            lengths = sorted({r["length"] for r in rs})
            pooled = [
                sum(r["errors"] for r in rs if r["length"] == n)
                / max(1, sum(r["reads"] for r in rs if r["length"] == n))
                for n in lengths
            ]
            (line,) = ax.plot(lengths, pooled, marker="o", label=scheme)
            ax.scatter([r["length"] for r in rs], [r["error_rate"] for r in rs], s=8,
                       color=line.get_color(), alpha=0.5)  # fmt: skip
        ax.set(title=split, xscale="log", xlabel="evaluation length (tokens)")
    axes[0, 0].set_ylabel("read error rate")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"Flip-flop read errors, {_seeds(rows)} seeds (dots: each seed)", fontsize=10)
    fig.tight_layout()
    return fig


def fflm_curve(results):
    """In-distribution read errors during training, every seed, one panel per scheme."""
    plt = _plt()
    rows = results["fflm_curve"]
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    fig, axes = _grid(plt, len(schemes), 4, 13, 2.4, sharey=True, sharex=True)
    for ax, scheme in zip(axes.flat, schemes, strict=False):
        for seed in dict.fromkeys(r["seed"] for r in rows):
            rs = _pick(rows, scheme=scheme, seed=seed)
            ax.plot([r["step"] for r in rs], [r["error_rate"] for r in rs], lw=0.9, color="C0",
                    alpha=0.8)  # fmt: skip
        ax.set(title=scheme, ylim=(-0.02, 0.6))
    for ax in axes[-1, :]:
        ax.set_xlabel("training step")
    for ax in axes[:, 0]:
        ax.set_ylabel("read error rate")
    fig.suptitle("Flip-flop in-distribution read errors during training, each seed", fontsize=10)
    fig.tight_layout()
    return fig


def recall_lead(results):
    """Accuracy of the far bands with and without fillers before the inputs, every seed."""
    plt = _plt()
    rows = [r for r in results["recall_lead"] if r["attention"] == "full"]
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    bands = list(dict.fromkeys(r["band"] for r in rows))
    leads = sorted({r["lead"] for r in rows})
    fig, axes = plt.subplots(1, len(schemes), figsize=(3 * len(schemes) + 1, 3.2),
                             sharey=True, squeeze=False)  # fmt: skip
    for ax, scheme in zip(axes[0], schemes, strict=True):
        for i, lead in enumerate(leads):
            for j, band in enumerate(bands):
                accs = [r["accuracy"] for r in _pick(rows, scheme=scheme, band=band, lead=lead)]
                ax.plot(
                    [j + 0.15 * (2 * i - 1)] * len(accs),
                    accs,
                    "o",
                    ms=3,
                    color=f"C{i}",
                    label=f"{lead} fillers before" if j == 0 else None,
                )
        ax.set_xticks(range(len(bands)), bands)
        ax.set_title(scheme, fontsize=10)
    axes[0][0].set_ylabel("recall accuracy (full attention)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"The far bands moved away from the start ({_seeds(rows)} seeds)")
    fig.tight_layout()
    return fig


def needle_grid(results):
    """Mean recall accuracy of one needle by depth and context length, one heatmap per scheme.

    When ``results`` also holds the ``recall`` rows, each scheme's mean is over the seeds
    whose model learned the task (the outcome is bimodal), and its title says how many; a
    scaled RoPE (``"rope:<method>"``) is RoPE's model, so it counts RoPE's seeds.
    """
    plt = _plt()
    raw = results["needle_grid"]
    learned = {}
    for r in results.get("recall", []):
        if r["factor"] == 0:
            learned.setdefault(r["scheme"], set())
            if r["learned"] == 1.0:
                learned[r["scheme"]].add(r["seed"])

    def base(scheme):  # "rope:pi" is the RoPE model scaled at test time: RoPE's seeds
        return str(scheme).split(":")[0]

    if learned:
        raw = [r for r in raw if r["seed"] in learned.get(base(r["scheme"]), ())]
    rows = _summary(raw, "depth") if raw else []
    schemes = list(dict.fromkeys(r["scheme"] for r in results["needle_grid"]))
    depths = sorted({r["depth"] for r in results["needle_grid"]})
    factors = sorted({r["factor"] for r in results["needle_grid"]})
    fig, axes = _grid(plt, len(schemes), 3, 3.4 * min(3, len(schemes)) + 1, 3.2)
    for ax, scheme in zip(axes.flat, schemes, strict=False):
        grid = [[float("nan")] * len(factors) for _ in depths]  # NaN: blank cell
        for r in _pick(rows, scheme=scheme):
            grid[depths.index(r["depth"])][factors.index(r["factor"])] = r["accuracy"]
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        if not _pick(rows, scheme=scheme):
            ax.text(len(factors) / 2 - 0.5, len(depths) / 2 - 0.5, "no seed learned the task",
                    ha="center", va="center", fontsize=9)  # fmt: skip
        for i, line in enumerate(grid):
            for j, v in enumerate(line):
                if v == v:  # not NaN: the model reaches that length
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8,
                            color="k" if v > 0.5 else "w")  # fmt: skip
        ax.set_xticks(range(len(factors)), [_context(f) for f in factors])
        ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        title = scheme
        if learned:
            seeds = {r["seed"] for r in results["needle_grid"] if r["scheme"] == scheme}
            title += f" ({len(learned.get(base(scheme), ()))} of {len(seeds)} learned)"
        ax.set(title=title, xlabel="context length")
    for ax in axes[:, 0]:
        ax.set_ylabel("needle depth (of the context)")
    which = "the seeds that learned the task" if learned else f"{_seeds(raw)} seeds"
    fig.suptitle(f"Needle recall by depth and length (mean over {which})", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))  # room for the title
    fig.colorbar(image, ax=axes.ravel().tolist(), label="accuracy", shrink=0.8)
    return fig


#: Experiment name -> figure function: ``f(results)``; ``passkey`` also takes ``sequences``.
FIGURES: dict[str, Callable[..., Any]] = {
    "training": training,
    "extrapolation": extrapolation,
    "rope_scaling": rope_scaling,
    "rope_budget": rope_budget,
    "lm_budget": lm_budget,
    "early_tokens": early_tokens,
    "passkey": passkey,
    "injection": injection,
    "positions": positions,
    "sliding": sliding,
    "rope_base": rope_base,
    "alibi_slopes": alibi_slopes,
    "yarn_sweep": yarn_sweep,
    "recall": recall,
    "recall_answers": recall_answers,
    "recall_curve": recall_curve,
    "needle_grid": needle_grid,
    "recall_lead": recall_lead,
    "fflm": fflm,
    "fflm_curve": fflm_curve,
}
