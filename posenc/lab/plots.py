"""Figures of the lab's results (matplotlib, imported when called).

Each function takes the ``results`` mapping of :func:`posenc.lab.run_all`
(``output["results"]``, one row per seed) and returns a
:class:`matplotlib.figure.Figure` that shows the mean over seeds with its 95%
t-interval (:func:`posenc.lab.summarize`) as a band or error bar.
"""

from __future__ import annotations

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
    return len({r.get("seed") for r in rows})


def training(results):
    plt = _plt()
    rows = summarize(results["training"])
    fig, ax = plt.subplots(figsize=(7, 4))
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


def extrapolation(results):
    plt = _plt()
    rows = summarize(results["extrapolation"])
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, scheme in enumerate(schemes):
        rs = _pick(rows, scheme=scheme)
        shift = 2 ** ((i - len(schemes) / 2) * 0.02)  # spread the error bars sideways
        ax.errorbar(
            [r["factor"] * shift for r in rs], [r["excess"] for r in rs],
            yerr=[[r["excess"] - r["excess_lo"] for r in rs],
                  [r["excess_hi"] - r["excess"] for r in rs]],
            marker="o", ms=4, capsize=2, label=scheme,
        )  # fmt: skip
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


def rope_scaling(results):
    plt = _plt()
    rows = summarize(results["rope_scaling"])
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


def passkey(results):
    """One panel per scheme (the curves sit on top of each other in a single panel)."""
    plt = _plt()
    rows = summarize(results["passkey"])
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
            rs = _pick(rows, scheme=name, length=long_len)
            ax.errorbar(
                [r["hi"] for r in rs], [r["accuracy"] for r in rs],
                yerr=[[r["accuracy"] - r["accuracy_lo"] for r in rs],
                      [r["accuracy_hi"] - r["accuracy"] for r in rs]],
                marker="o", ms=3, capsize=2, label=name.split(":")[-1] if ":" in name else "plain",
            )  # fmt: skip
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
        f"Passkey retrieval in inputs of {long_len} (dotted: L; dashed: chance; "
        f"{_seeds(results['passkey'])} seeds, 95% t-interval)",
        fontsize=11,
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


FIGURES = {
    "training": training,
    "extrapolation": extrapolation,
    "rope_scaling": rope_scaling,
    "early_tokens": early_tokens,
    "passkey": passkey,
    "injection": injection,
}
