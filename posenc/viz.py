"""Plot helpers shared by the chapters (needs Matplotlib).

Each helper draws on a given Matplotlib ``Axes`` (or a new one) and returns it,
so chapters compose figures freely.  Helpers only draw: every number they show
comes from a ``posenc`` function the chapter also checks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes

__all__ = ["table_heatmap", "clock_faces", "unit_circle_pairs"]


def _axes(ax: Axes | None) -> Axes:
    out: Axes = ax if ax is not None else plt.subplots()[1]
    return out


def table_heatmap(
    table: torch.Tensor,
    *,
    ax: Axes | None = None,
    title: str = "",
    xlabel: str = "dimension",
    ylabel: str = "position",
    cmap: str = "RdBu_r",
    symmetric: bool = True,
    colorbar: bool = True,
) -> Axes:
    """Draw ``table: (positions, features)`` as an image, position down, feature across.

    With ``symmetric=True`` the colour scale is centred on 0 (for tables in
    [-1, 1] such as the sinusoidal one); otherwise it spans the data.
    """
    ax = _axes(ax)
    data = table.detach().double().cpu().numpy()
    lim = float(abs(data).max()) if data.size else 1.0
    vmin, vmax = (-lim, lim) if symmetric else (None, None)  # None: imshow's default, the data
    im = ax.imshow(data, aspect="auto", interpolation="nearest", cmap=cmap, vmin=vmin, vmax=vmax)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


def clock_faces(
    sin: torch.Tensor,
    cos: torch.Tensor,
    *,
    ax: Axes | None = None,
    title: str = "",
    labels: Sequence[str] | None = None,
) -> Axes:
    """One clock per frequency: a hand from the centre to ``(sin_i, cos_i)``.

    ``sin`` and ``cos`` are ``(h,)``: the pairs of one row of a sinusoidal
    table.  The hand is drawn with ``sin`` on the horizontal axis and ``cos`` on
    the vertical axis, so position 0 points straight up (12 o'clock) and, as
    the position grows, every hand turns clockwise at its own speed.
    """
    ax = _axes(ax)
    sin = sin.detach().double().cpu()
    cos = cos.detach().double().cpu()
    h = sin.shape[0]
    theta = torch.linspace(0, 2 * math.pi, 100, dtype=torch.float64)
    for i in range(h):
        x0 = 2.5 * i
        ax.plot(x0 + theta.cos(), theta.sin(), color="0.7", lw=1)
        ax.plot([x0, x0 + sin[i].item()], [0, cos[i].item()], color="C3", lw=2)
        ax.plot([x0], [0], "k.", ms=3)
        if labels is not None:
            ax.text(x0, -1.45, labels[i], ha="center", va="top", fontsize=8)
    ax.set_aspect("equal")
    ax.set_xlim(-1.3, 2.5 * (h - 1) + 1.3)
    ax.set_ylim(-1.9 if labels is not None else -1.3, 1.3)
    ax.axis("off")
    ax.set_title(title)
    return ax


def unit_circle_pairs(
    points: torch.Tensor,
    *,
    ax: Axes | None = None,
    title: str = "",
    annotate: Sequence[object] | None = None,
) -> Axes:
    """Scatter 2-D points ``(n, 2)`` (e.g. successive ``(sin, cos)`` pairs) with the unit circle.

    Points are joined in order and numbered by ``annotate`` (a sequence of
    labels, one per point) when given, to show a direction of travel.
    """
    ax = _axes(ax)
    pts = points.detach().double().cpu()
    theta = torch.linspace(0, 2 * math.pi, 200, dtype=torch.float64)
    ax.plot(theta.cos(), theta.sin(), color="0.8", lw=1)
    ax.plot(pts[:, 0], pts[:, 1], "-o", color="C0", ms=4, lw=1)
    if annotate is not None:
        for (x, y), label in zip(pts.tolist(), annotate, strict=True):
            ax.annotate(str(label), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_aspect("equal")
    ax.axhline(0, color="0.9", lw=0.8)
    ax.axvline(0, color="0.9", lw=0.8)
    ax.set_title(title)
    return ax
