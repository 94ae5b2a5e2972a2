"""Figures of the lab's results (matplotlib, imported when called).

Each function takes the ``results`` mapping of :func:`posenc.lab.run_all`
(``output["results"]``) and returns a :class:`matplotlib.figure.Figure`.
"""

from __future__ import annotations

__all__ = ["FIGURES"]


def _plt():
    import matplotlib.pyplot as plt

    return plt


def training(results):
    plt = _plt()
    rows = results["training"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        rs = [r for r in rows if r["scheme"] == scheme]
        ax.plot([r["step"] for r in rs], [r["loss"] for r in rs], label=scheme, lw=1.2)
    ax.axhline(rows[0]["floor"], color="k", ls="--", label="entropy floor")
    ax.set(xlabel="step", ylabel="training loss (nats/token)", title="Training at length L")
    ax.legend(ncol=2, fontsize=8)
    fig.tight_layout()
    return fig


def extrapolation(results):
    plt = _plt()
    rows = results["extrapolation"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        rs = [r for r in rows if r["scheme"] == scheme]
        ax.plot([r["factor"] for r in rs], [r["excess"] for r in rs], "o-", label=scheme)
    ax.set_xscale("log", base=2)
    ax.set(
        xlabel="evaluation length / training length",
        ylabel="loss above the entropy floor (nats)",
        title="Train short, test long",
    )
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    return fig


def rope_scaling(results):
    plt = _plt()
    rows = results["rope_scaling"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, tuned in zip(axes, (False, True), strict=True):
        for method in dict.fromkeys(r["method"] for r in rows):
            rs = [r for r in rows if r["method"] == method and r["finetuned"] == tuned]
            ax.plot([r["factor"] for r in rs], [r["excess"] for r in rs], "o-", label=method)
        ax.set_xscale("log", base=2)
        ax.set(
            xlabel="evaluation length / training length",
            title="after a short fine-tune" if tuned else "no fine-tune (scale = length / L)",
        )
    axes[0].set_ylabel("loss above the entropy floor (nats)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def early_tokens(results):
    plt = _plt()
    rows = results["early_tokens"]
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    fig, axes = plt.subplots(1, len(schemes), figsize=(10, 4), sharey=True)
    for ax, scheme in zip(axes, schemes, strict=True):
        for window in ("short", "long"):
            rs = [r for r in rows if r["scheme"] == scheme and r["window"] == window]
            ax.plot([r["position"] for r in rs], [r["loss"] for r in rs], label=f"{window} window")
        rs = [r for r in rows if r["scheme"] == scheme and r["window"] == "long"]
        ax.plot([r["position"] for r in rs], [r["floor"] for r in rs], "k--", label="floor")
        ax.set(xlabel="position inside the window", title=scheme)
    axes[0].set_ylabel("loss (nats)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def passkey(results):
    plt = _plt()
    rows = results["passkey"]
    long_len = max(r["length"] for r in rows)
    fig, ax = plt.subplots(figsize=(7, 4))
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        rs = [r for r in rows if r["scheme"] == scheme and r["length"] == long_len]
        ax.plot([r["hi"] for r in rs], [r["accuracy"] for r in rs], "o-", label=scheme)
    train_len = min(r["length"] for r in rows)
    ax.axvline(train_len, color="k", ls=":", label="training length")
    ax.axhline(1 / 8, color="gray", ls="--", label="chance")
    ax.set_xscale("log", base=2)
    ax.set(
        xlabel="distance of the value from the query (band upper edge)",
        ylabel="retrieval accuracy",
        title=f"Passkey retrieval in inputs of length {long_len}",
        ylim=(0, 1.05),
    )
    ax.legend(ncol=2, fontsize=8)
    fig.tight_layout()
    return fig


def injection(results):
    plt = _plt()
    rows = results["injection"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels, values = [], []
    for r in rows:
        labels.append(f"{r['scheme']}\n{r['inject']}\n{r['factor']}L")
        values.append(r["excess"])
    ax.bar(range(len(values)), values, color="tab:blue")
    ax.set_xticks(range(len(values)), labels, fontsize=7)
    ax.set(ylabel="loss above the floor (nats)", title="Position at the input or every layer")
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
