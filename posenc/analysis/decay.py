"""Long-range decay of sinusoidal inner products, read as an oscillatory integral.

For the sinusoidal encoding with frequencies ``theta_i = base**(-2i/d)`` the
inner product of two position vectors depends only on the distance ``x = m - n``:

    <p_m, p_n> = sum_{i<d/2} cos(x theta_i) ~ (d/2) Re int_0^1 exp(i x base**(-t)) dt,

a Riemann sum turned into an integral (Su, 2021).  This module evaluates that
integral in closed form through the sine and cosine integrals Si and Ci
(Abramowitz & Stegun, 1964, ch. 5), evaluates the general integral
``int_0^1 h(t) exp(i x theta(t)) dt`` by adaptive quadrature for any phase
``theta``, gives the discrete sum itself, the bound RoFormer (Su et al., 2024,
Sec. 3.4.3) derives by Abel summation, and a module with trainable frequencies.

Every function here works in float64: these are reference values for the book,
and the integrals involve cancellations (``Ci(x) - Ci(x/base)``) that lower
precision would ruin.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import TypeAlias, Union

import numpy as np
import numpy.typing as npt
import torch
from scipy.integrate import quad_vec
from scipy.special import sici

from .._checks import check_even, check_float, check_int, check_tensor
from .._types import Device
from ..sinusoidal import sinusoidal_inv_freq

__all__ = [
    "sinusoid_decay_integral",
    "oscillatory_integral",
    "sinusoid_dot_product",
    "rope_decay_bound",
    "TrainableFrequencies",
    "fit_frequencies",
]

# What the integrals return: a tensor for a tensor ``x``, else NumPy (a scalar for 0-d).
_Complex: TypeAlias = Union[torch.Tensor, npt.NDArray[np.complex128], np.complex128]  # noqa: UP007


def _as_float64_array(
    name: str, x: npt.ArrayLike | torch.Tensor
) -> tuple[npt.NDArray[np.float64], torch.device | None]:
    """``x`` as a float64 NumPy array, plus the device to return a tensor on (or None)."""
    if isinstance(x, torch.Tensor):
        if x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name} must hold real numbers, got dtype {x.dtype}")
        return x.detach().to("cpu", torch.float64).numpy(), x.device
    arr = np.asarray(x)
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise TypeError(f"{name} must be a real number, array or tensor, got dtype {arr.dtype}")
    return arr.astype(np.float64), None


def _wrap(result: npt.NDArray[np.complex128], device: torch.device | None) -> _Complex:
    """Return a tensor on ``device`` when the input was a tensor, else NumPy (scalar for 0-d)."""
    if device is not None:
        return torch.from_numpy(np.ascontiguousarray(result)).to(device)
    return result[()] if result.ndim == 0 else result


def _check_base(base: float) -> float:
    base = check_float("base", base)
    if base <= 1.0:
        raise ValueError(f"base must be > 1 (so that theta_t = base**-t decreases), got {base}")
    return base


def sinusoid_decay_integral(x: npt.ArrayLike | torch.Tensor, base: float = 10000.0) -> _Complex:
    r"""Closed form of :math:`I(x) = \int_0^1 e^{i x\, \mathrm{base}^{-t}}\, dt`.

    Substituting :math:`u = x\,\mathrm{base}^{-t}` (so :math:`dt = -du / (u \ln \mathrm{base})`)
    turns the integral into :math:`\frac{1}{\ln b}\int_{x/b}^{x} e^{iu}\, du / u`, i.e. for
    :math:`x > 0`

    .. math::
        I(x) = \frac{\mathrm{Ci}(x) - \mathrm{Ci}(x/b) + i\,[\mathrm{Si}(x) - \mathrm{Si}(x/b)]}
                    {\ln b},

    with the sine and cosine integrals of Abramowitz & Stegun (1964), 5.2.1-5.2.2.
    :math:`I(-x) = \overline{I(x)}` and :math:`I(0) = 1`.  The logarithmic singularity of
    Ci cancels in the difference, at the cost of about ``|ln x|`` units of roundoff; so
    for ``|x| < 1e-5`` the Taylor polynomial
    :math:`1 + i x\, E[\theta] - x^2 E[\theta^2] / 2` is used instead (its error,
    :math:`|x|^3 E[\theta^3] / 6`, is below roundoff there), with
    :math:`E[\theta^k] = (1 - b^{-k}) / (k \ln b)`.

    Parameters
    ----------
    x : float, array_like or torch.Tensor
        Distances ``m - n`` (any shape, any real dtype; evaluated in float64).
    base : float
        The base of the frequencies, ``> 1`` (10000 in Vaswani et al., 2017).

    Returns
    -------
    complex or numpy.ndarray or torch.Tensor
        :math:`I(x)`, complex128, same shape as ``x``; a tensor on ``x``'s device when
        ``x`` is a tensor, otherwise NumPy.  ``d/2 * I(x).real`` approximates the inner
        product ``<p_m, p_n>`` of the sinusoidal table.
    """
    base = _check_base(base)
    xs, device = _as_float64_array("x", x)
    log_b = math.log(base)
    a = np.abs(xs)
    small = a < 1e-5
    safe = np.where(small, 1.0, a)  # keep sici away from 0, where Ci = -inf
    si_hi, ci_hi = sici(safe)
    si_lo, ci_lo = sici(safe / base)
    value = (ci_hi - ci_lo + 1j * (si_hi - si_lo)) / log_b
    mean1 = (1.0 - 1.0 / base) / log_b  # E[theta], theta = base**-t, t ~ U(0, 1)
    mean2 = (1.0 - base**-2) / (2.0 * log_b)  # E[theta^2]
    value = np.where(small, 1.0 - a * a * mean2 / 2 + 1j * a * mean1, value)
    value = np.where(xs < 0, np.conj(value), value)  # I(-x) = conj(I(x))
    return _wrap(value.astype(np.complex128), device)


def oscillatory_integral(
    theta: Callable[[float], float],
    x: npt.ArrayLike | torch.Tensor,
    *,
    weight: Callable[[float], float] | None = None,
    epsabs: float = 1e-13,
    epsrel: float = 1e-12,
) -> _Complex:
    r"""Adaptive quadrature of :math:`\int_0^1 h(t)\, e^{i x \theta(t)}\, dt` for any phase.

    The integrand is evaluated for all ``x`` at once and the interval is split
    (Gauss-Kronrod, :func:`scipy.integrate.quad_vec`) until every entry meets the
    tolerance, so a whole curve over ``x`` costs about as much as its most
    oscillatory point.

    Parameters
    ----------
    theta : callable
        The phase :math:`\theta(t)` on :math:`[0, 1]`, called with a Python float.
    x : float, array_like or torch.Tensor
        Distances (any shape; float64).  Cost grows with
        ``max|x| * max|theta'|``, the number of oscillations.
    weight : callable, optional
        The amplitude :math:`h(t)`; 1 when omitted.
    epsabs, epsrel : float
        Absolute and relative tolerance, passed to ``quad_vec`` (max norm over ``x``).

    Returns
    -------
    complex or numpy.ndarray or torch.Tensor
        complex128 of ``x``'s shape; a tensor on ``x``'s device when ``x`` is a tensor.
    """
    if not callable(theta):
        raise TypeError(f"theta must be callable t -> theta(t), got {type(theta).__name__}")
    if weight is not None and not callable(weight):
        raise TypeError(f"weight must be callable t -> h(t) or None, got {type(weight).__name__}")
    epsabs = check_float("epsabs", epsabs, positive=True)
    epsrel = check_float("epsrel", epsrel, minimum=0.0)
    xs, device = _as_float64_array("x", x)
    flat = xs.reshape(-1)

    def integrand(t: float) -> npt.NDArray[np.complex128]:
        phase: npt.NDArray[np.complex128] = np.exp(1j * flat * float(theta(t)))
        return phase if weight is None else float(weight(t)) * phase

    value, _ = quad_vec(integrand, 0.0, 1.0, epsabs=epsabs, epsrel=epsrel, norm="max", limit=20000)
    return _wrap(np.asarray(value, dtype=np.complex128).reshape(xs.shape), device)


def _as_distance(distance: npt.ArrayLike | torch.Tensor) -> torch.Tensor:
    if isinstance(distance, torch.Tensor):
        if distance.is_complex() or distance.dtype == torch.bool:
            raise TypeError(f"distance must hold real numbers, got dtype {distance.dtype}")
        return distance.to(torch.float64)
    if isinstance(distance, bool):
        raise TypeError("distance must be a real number, sequence or tensor, got bool")
    if isinstance(distance, numbers.Real):
        return torch.tensor(float(distance), dtype=torch.float64)
    try:
        return torch.as_tensor(np.asarray(distance, dtype=np.float64))
    except (TypeError, ValueError):
        raise TypeError(
            f"distance must be a real number, sequence or tensor, got {type(distance).__name__}"
        ) from None


def sinusoid_dot_product(
    distance: npt.ArrayLike | torch.Tensor, dim: int, base: float = 10000.0
) -> torch.Tensor:
    r"""The inner product :math:`\langle p_m, p_n\rangle = \sum_{i<d/2} \cos(x\,\theta_i)`.

    With :math:`\theta_i = \mathrm{base}^{-2i/d}` and :math:`x = m - n`, this is the
    exact value, for either layout (interleaved or half) of the sinusoidal table of
    Vaswani et al. (2017), since the dot product does not depend on the order of features.

    Parameters
    ----------
    distance : float, sequence or torch.Tensor
        ``x = m - n`` (any shape; even function of it).
    dim : int
        Even model dimension ``d``.
    base : float
        Frequency base, ``> 1``.

    Returns
    -------
    torch.Tensor
        float64, ``distance``'s shape, on its device.
    """
    dim = check_even("dim", dim)
    base = _check_base(base)
    x = _as_distance(distance)
    return torch.cos(x[..., None] * sinusoidal_inv_freq(dim, base=base, device=x.device)).sum(-1)


def rope_decay_bound(
    distance: npt.ArrayLike | torch.Tensor, dim: int = 128, base: float = 10000.0
) -> torch.Tensor:
    r"""RoFormer's long-term decay bound :math:`\frac{1}{d/2}\sum_{j=1}^{d/2} |S_j|`.

    With :math:`\theta_k = \mathrm{base}^{-2k/d}` and partial sums
    :math:`S_j = \sum_{k=0}^{j-1} e^{i x \theta_k}`, Abel summation gives, for any
    weights :math:`h_0, \dots, h_{d/2-1}` and :math:`h_{d/2} = 0`,

    .. math::
        \Bigl|\sum_{k=0}^{d/2-1} h_k e^{i x \theta_k}\Bigr|
        \le \Bigl(\max_k |h_{k+1} - h_k|\Bigr) \sum_{j=1}^{d/2} |S_j|
        = \Bigl(\max_k |h_{k+1} - h_k|\Bigr)\, \frac{d}{2}\, \mathrm{bound}(x),

    (Su et al., 2024, Sec. 3.4.3).  In RoPE the :math:`h_k` are the products
    :math:`q_{2k:2k+2} \overline{k_{2k:2k+2}}` of query and key pairs, so the bound
    caps the attention logit at relative distance :math:`x`; it decays as
    :math:`|x|` grows.

    Parameters
    ----------
    distance : float, sequence or torch.Tensor
        Relative distance ``x`` (any shape, any real dtype; evaluated in float64).
        The bound is even in ``x``.
    dim : int
        Even head dimension ``d`` (128 in RoFormer's figure).
    base : float
        Frequency base, ``> 1``.

    Returns
    -------
    torch.Tensor
        float64, ``distance``'s shape, on its device.  At ``x = 0`` every
        :math:`|S_j| = j`, so the bound starts at its maximum ``(d/2 + 1) / 2``.
    """
    dim = check_even("dim", dim)
    base = _check_base(base)
    x = _as_distance(distance)
    angle = x[..., None] * sinusoidal_inv_freq(dim, base=base, device=x.device)
    # Partial sums S_1 .. S_{d/2}: cumulative sums of cos and sin, then the modulus.
    s = torch.hypot(torch.cos(angle).cumsum(-1), torch.sin(angle).cumsum(-1))
    return s.mean(-1)


class TrainableFrequencies(torch.nn.Module):
    r"""Sinusoidal frequencies as parameters, initialised at :math:`\mathrm{base}^{-2i/d}`.

    Su (2021) suggests starting from the standard frequencies and letting training
    adjust them.  The module's output is the normalised inner product of two
    sinusoidal position vectors at distance ``x``:

    .. math:: g(x) = \frac{1}{d/2} \sum_{i<d/2} \cos(x\, \theta_i),

    so at initialisation it equals :func:`sinusoid_dot_product` divided by ``d/2``.

    Parameters
    ----------
    dim : int
        Even dimension ``d``; there are ``d/2`` frequencies.
    base : float
        Base of the initial frequencies, ``> 1``.
    dtype : torch.dtype
        float32 or float64 (default, for gradcheck and reproducible training).
    device : torch.device, optional

    Attributes
    ----------
    theta : torch.nn.Parameter
        ``(d/2,)`` frequencies.
    """

    def __init__(
        self,
        dim: int,
        base: float = 10000.0,
        *,
        dtype: torch.dtype = torch.float64,
        device: Device = None,
    ) -> None:
        super().__init__()
        dim = check_even("dim", dim)
        base = _check_base(base)
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self.dim, self.base = dim, base
        self.theta = torch.nn.Parameter(
            sinusoidal_inv_freq(dim, base=base, device=device).to(dtype)
        )

    def forward(self, distance: torch.Tensor) -> torch.Tensor:
        """``g(x)`` for distances ``(...)``; returns ``(...)`` in the parameter dtype."""
        distance = check_tensor("distance", distance)
        x = distance.to(device=self.theta.device, dtype=self.theta.dtype)
        return torch.cos(x[..., None] * self.theta).mean(-1)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}"


def fit_frequencies(
    module: TrainableFrequencies,
    distance: torch.Tensor,
    target: torch.Tensor,
    *,
    steps: int = 200,
    lr: float = 1e-3,
) -> list[float]:
    """Fit ``module`` so that ``module(distance)`` approaches ``target`` (mean squared error).

    Full-batch Adam, no randomness, so a run is deterministic.  Returns the loss
    before each step and after the last, ``steps + 1`` floats.
    """
    if not isinstance(module, TrainableFrequencies):
        raise TypeError(f"module must be a TrainableFrequencies, got {type(module).__name__}")
    distance = check_tensor("distance", distance)
    target = check_tensor("target", target)
    if target.shape != distance.shape:
        raise ValueError(
            f"target must have distance's shape {tuple(distance.shape)}, got {tuple(target.shape)}"
        )
    steps = check_int("steps", steps, minimum=0)
    lr = check_float("lr", lr, positive=True)
    target = target.to(device=module.theta.device, dtype=module.theta.dtype)
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    losses: list[float] = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.mean((module(distance) - target) ** 2)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        losses.append(torch.mean((module(distance) - target) ** 2).item())
    return losses
