"""Sweeps that explain the extrapolation results: RoPE's base, ALiBi's slopes, YaRN's beta.

:func:`rope_base` trains RoPE at each base of ``config.rope_bases``, with the
configuration's heads and with ``wide_heads`` (a larger head dimension), and
scores each with no scaling, PI, NTK and YaRN; :func:`alibi_slopes` trains
ALiBi with every slope multiplied by each of ``config.alibi_slope_scales``;
:func:`yarn_sweep` scores the standard RoPE model with YaRN at each
``beta_fast`` of ``config.yarn_betas``, NTK beside it.  Two pure functions
say why, without training: :func:`unseen_angle_pairs` counts the rotary pairs
that meet angles training never showed, and :func:`yarn_split` gives how much
YaRN divides each pair's frequency.

A variant equal to the configuration (the configuration's base, heads, or
slope scale 1) is the ``extrapolation`` model itself, with its seed.
"""

from __future__ import annotations

import copy
import math

import torch

import posenc

from .._checks import check_float, check_int
from .lab import Lab, Row, loss_row, rope_scaling_for
from .model import TinyDecoder

__all__ = [
    "DESCRIPTIONS",
    "EXPERIMENTS",
    "alibi_slopes",
    "rope_base",
    "unseen_angle_pairs",
    "yarn_split",
    "yarn_sweep",
]

#: the scalings :func:`rope_base` compares (names of :data:`posenc.lab.lab.ROPE_METHODS`)
SWEEP_METHODS = ("none", "ntk", "yarn", "pi")


def _variant(lab: Lab, **settings: float) -> dict[str, float]:
    """``settings`` without those equal to the configuration's (so the stored model is reused)."""
    c = lab.config
    same = {"rope_base": c.rope_base, "heads": c.heads, "alibi_slope_scale": 1.0}
    return {k: v for k, v in settings.items() if v != same[k]}


def _scaled(lab: Lab, model: TinyDecoder, scaling: posenc.RopeScaling | None) -> TinyDecoder:
    """A copy of the RoPE ``model`` with ``scaling`` (the trained model is left as it is)."""
    model = copy.deepcopy(model)
    model.set_rope_scaling(scaling)
    return model.to(lab.device)


def rope_base(lab: Lab) -> list[Row]:
    """RoPE trained at each base, with ``heads`` and with ``wide_heads`` heads, then scaled.

    For each base of ``config.rope_bases`` and each head count (the
    configuration's, then ``wide_heads``, so ``head_dim = d_model / heads``),
    one model trained at ``L``, scored at every evaluation length ``f L`` with
    each of :data:`SWEEP_METHODS` at factor ``s = f`` (at ``f = 1`` every
    method is plain RoPE: one evaluation, one row per method).  Rows:
    ``base``, ``head_dim``, ``method``, ``factor``, ``length``, ``loss``,
    ``floor``, ``excess``, ``eval_se``.
    """
    c = lab.config
    rows: list[Row] = []
    for base in c.rope_bases:
        for heads in dict.fromkeys((c.heads, c.wide_heads)):
            model, _ = lab.model(
                "lm", "rope", "input", **_variant(lab, rope_base=base, heads=heads)
            )
            keys = {"base": base, "head_dim": c.d_model // heads}
            for f in c.eval_factors:
                if f == 1:
                    row = loss_row(lab, model, 1, **keys, method="none")
                    rows += [{**row, "method": m} for m in SWEEP_METHODS]
                    continue
                for method in SWEEP_METHODS:
                    scaled = _scaled(lab, model, rope_scaling_for(method, f, c.train_len))
                    rows.append(loss_row(lab, scaled, f, **keys, method=method))
    return rows


def alibi_slopes(lab: Lab) -> list[Row]:
    """ALiBi with every slope multiplied by each ``config.alibi_slope_scales`` (1: the paper's).

    Rows: ``scale``, ``factor``, ``length``, ``loss``, ``floor``, ``excess``, ``eval_se``.
    """
    c = lab.config
    rows: list[Row] = []
    for scale in c.alibi_slope_scales:
        model, _ = lab.model(
            "lm", "alibi", inject="input", **_variant(lab, alibi_slope_scale=scale)
        )
        rows += [loss_row(lab, model, f, scale=scale) for f in c.eval_factors]
    return rows


def yarn_sweep(lab: Lab) -> list[Row]:
    """The standard RoPE model at test time with YaRN for each ``beta_fast``, and NTK.

    At every evaluation length ``f L`` with ``f > 1``, factor ``s = f``: YaRN
    with ``beta_fast`` from ``config.yarn_betas`` and ``beta_slow = 1``, and
    NTK-aware scaling for reference.  Rows: ``method`` (``"yarn"``/``"ntk"``),
    ``beta_fast`` (``None`` for NTK), ``factor``, ``length``, ``loss``,
    ``floor``, ``excess``, ``eval_se``.
    """
    c = lab.config
    model, _ = lab.model("lm", "rope")
    rows: list[Row] = []
    for f in c.eval_factors:
        if f == 1:
            continue
        for beta in c.yarn_betas:
            scaling = posenc.RopeScaling.yarn(f, c.train_len, beta_fast=beta, beta_slow=1.0)
            rows.append(
                loss_row(lab, _scaled(lab, model, scaling), f, method="yarn", beta_fast=beta)
            )
        ntk = _scaled(lab, model, rope_scaling_for("ntk", f, c.train_len))
        rows.append(loss_row(lab, ntk, f, method="ntk", beta_fast=None))
    return rows


# ------------------------------------------------------------------ pure maths


def unseen_angle_pairs(head_dim: int, base: float, train_len: int, factor: float) -> int:
    """How many rotary pairs meet, at distances up to ``factor * L``, angles unseen below ``L``.

    Pair ``i`` turns by ``theta_i = base ** (-2 i / head_dim)`` per position.
    At relative distances ``0 .. L-1`` (all a model trained at ``L`` sees) its
    angle runs from 0 to ``theta_i (L - 1)``.  When that is at least ``2 pi``
    the pair has made a full turn: its angles have covered the circle.  Else
    they cover only the arc ``[0, theta_i (L - 1)]``, and the pair is counted
    when the angle at the longest distance, ``theta_i (factor L - 1)``, lies
    beyond that arc's end (true for every such pair when ``factor L > L``).
    So the count is ``#{i : theta_i (L - 1) < 2 pi}`` when ``factor * L > L``,
    else 0.  (Angles are taken unwrapped: a pair with
    ``theta_i (L - 1) < 2 pi <= theta_i L`` is counted, though its angle
    modulo ``2 pi`` at distance ``L`` falls back inside the arc.)

    The frequencies are :func:`posenc.rope_frequencies` in float64; invalid
    arguments raise ``ValueError`` naming the argument.

    Parameters
    ----------
    head_dim
        The head dimension, even (``head_dim // 2`` rotary pairs).
    base
        RoPE's base (``> 0``).
    train_len
        ``L``, the training length (``>= 1``).
    factor
        The longest evaluation length as a multiple of ``L`` (``>= 1``).

    Returns
    -------
    The number of pairs, an int in ``0 .. head_dim // 2``.

    Examples
    --------
    >>> from posenc.lab import unseen_angle_pairs
    >>> unseen_angle_pairs(16, 100.0, 32, 4)    # pairs 3-7 turn less than once over L
    5
    >>> unseen_angle_pairs(16, 10000.0, 32, 4)  # a larger base slows pair 2 as well
    6
    >>> unseen_angle_pairs(16, 100.0, 32, 1)    # no distance beyond L: nothing unseen
    0
    """
    theta = _omega(head_dim, base)
    train_len = check_int("train_len", train_len, minimum=1)
    factor = check_float("factor", factor, minimum=1.0)
    if factor * train_len - 1 <= train_len - 1:
        return 0
    return int((theta * (train_len - 1) < 2 * math.pi).sum())


def yarn_split(
    head_dim: int,
    base: float,
    train_len: int,
    factor: float,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> torch.Tensor:
    """How much YaRN divides each rotary pair's frequency: float64 ``(head_dim // 2,)``.

    ``omega_i / omega_i'`` with ``omega_i`` the plain frequency and
    ``omega_i'`` YaRN's (:meth:`posenc.RopeScaling.yarn` with
    ``original_max_positions = train_len``): 1 for a pair kept,
    ``factor`` for a pair fully interpolated (as PI does), in between on the
    ramp.  YaRN keeps the pairs that make more than ``beta_fast`` turns over
    ``L`` and interpolates those with fewer than ``beta_slow``; its ramp runs
    over pair *indices*, computed from the betas and clamped to start at
    index 0 (as in the paper's code and transformers).  When even the
    fastest pair makes fewer than ``beta_fast`` turns, the ramp's start
    clamps to pair 0: pair 0 is then kept whatever its turns, and the ramp
    spans only the few pairs up to the ``beta_slow`` index.

    Parameters
    ----------
    head_dim
        The head dimension, even (``head_dim // 2`` rotary pairs).
    base
        RoPE's base (``> 0``).
    train_len
        ``L``, the training length: YaRN's ``original_max_positions`` (``>= 1``).
    factor
        YaRN's scale factor ``s`` (``>= 1``).
    beta_fast, beta_slow
        YaRN's turn thresholds (default 32 and 1, the paper's): pairs with more
        than ``beta_fast`` turns over ``L`` are kept, those with fewer than
        ``beta_slow`` divided by ``factor``.

    Returns
    -------
    ``omega_i / omega_i'`` for each pair ``i`` (fastest first), float64
    ``(head_dim // 2,)``, each in ``[1, factor]``.

    Examples
    --------
    >>> from posenc.lab import yarn_split
    >>> yarn_split(16, 100.0, 32, 4.0)   # pair 0 kept, pairs 1-2 on the ramp, 3-7 by 4
    tensor([1.0000, 1.3333, 2.0000, 4.0000, 4.0000, 4.0000, 4.0000, 4.0000],
           dtype=torch.float64)
    """
    plain = _omega(head_dim, base)
    scaling = posenc.RopeScaling.yarn(
        factor, check_int("train_len", train_len, minimum=1), beta_fast, beta_slow
    )
    return plain / scaling.frequencies(head_dim, base)


def _omega(head_dim: int, base: float) -> torch.Tensor:
    head_dim = check_int("head_dim", head_dim, minimum=2)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    return posenc.rope_frequencies(head_dim, base=check_float("base", base, positive=True))


EXPERIMENTS = {"rope_base": rope_base, "alibi_slopes": alibi_slopes, "yarn_sweep": yarn_sweep}

DESCRIPTIONS = {
    "rope_base": "RoPE trained at each base, also with a wider head, scored plain and with "
    "NTK, YaRN and PI",
    "alibi_slopes": "ALiBi trained with every slope scaled (1/4x to 4x), excess at every length",
    "yarn_sweep": "the standard RoPE model with YaRN at each beta_fast, and NTK, at test time",
}
