"""The complex-number derivation of the sinusoidal encoding (Su, 2021).

Ask for position vectors whose inner product depends only on the offset,
``<p_m, p_n> = g(m - n)``.  In two dimensions, read ``p = (x, y)`` as the
complex number ``x + iy``; then ``<p_m, p_n> = Re[p_m conj(p_n)]``, and the
stronger ansatz ``p_m conj(p_n) = q_{m-n}`` forces a constant modulus and
phases in arithmetic progression, ``p_m = r e^{i m theta}``.  Stacking ``d/2``
such pairs gives the sinusoidal table, in the article's ``[cos, sin]`` order.

A matrix whose entries depend only on the offset of their indices is a
Toeplitz matrix, so the property is measured by :func:`toeplitz_distance`,
which applies to any Gram matrix (sinusoidal, random, learned).
"""

from __future__ import annotations

import torch

from .._angles import cos_sin
from .._checks import check_even, check_float, check_int, check_tensor
from .._types import Device
from ..sinusoidal import sinusoidal_inv_freq

__all__ = [
    "toeplitz_projection",
    "toeplitz_distance",
    "complex_sinusoid",
    "pairs_to_complex",
    "complex_to_pairs",
    "polar_from_gram",
    "fit_relative_solution",
]


def _check_matrix(name: str, value: torch.Tensor) -> torch.Tensor:
    value = check_tensor(name, value, min_dim=2)
    if not (value.is_floating_point() or value.is_complex()):
        raise TypeError(f"{name} must be a floating or complex tensor, got dtype {value.dtype}")
    return value


def toeplitz_projection(gram: torch.Tensor) -> torch.Tensor:
    """The Toeplitz matrix nearest to ``gram`` in the Frobenius norm.

    Each diagonal ``{(i, j): j - i = k}`` is replaced by its mean.  Toeplitz
    matrices form a linear subspace and the diagonals are orthogonal
    coordinates of it, so this is the orthogonal projection onto it.

    Parameters
    ----------
    gram
        ``(..., n, k)`` real or complex tensor (square or not); leading
        dimensions are a batch.

    Returns
    -------
    Tensor of the same shape, dtype and device.
    """
    gram = _check_matrix("gram", gram)
    n, k = gram.shape[-2:]
    i = torch.arange(n, device=gram.device)[:, None]
    j = torch.arange(k, device=gram.device)
    diag = (j - i + n - 1).expand(*gram.shape[:-2], n, k).flatten(-2)  # diagonal index 0..n+k-2
    flat = gram.flatten(-2)
    sums = torch.zeros(*gram.shape[:-2], n + k - 1, dtype=gram.dtype, device=gram.device)
    sums.scatter_add_(-1, diag, flat)
    counts = torch.bincount(diag.reshape(-1, n * k)[0], minlength=n + k - 1)
    means = sums / counts.to(sums.real.dtype)
    return means.gather(-1, diag).view(gram.shape)


def toeplitz_distance(gram: torch.Tensor) -> torch.Tensor:
    """Relative distance of ``gram`` from the Toeplitz matrices: 0 iff entries depend on ``j - i``.

    ``||G - T(G)||_F / ||G||_F`` with ``T`` the nearest Toeplitz matrix
    (:func:`toeplitz_projection`).  It lies in ``[0, 1]``, is invariant to
    rescaling ``G``, and is 0 for the zero matrix.  Use it on the Gram matrix
    ``P @ P.T`` of any position table ``P`` ``(num_positions, dim)``, fixed or
    learned: it is 0 exactly when ``<p_m, p_n>`` depends only on ``m - n``.

    Parameters
    ----------
    gram
        ``(..., n, k)`` real or complex tensor; leading dimensions are a batch.

    Returns
    -------
    Real tensor of shape ``(...)``, in the real dtype matching ``gram``.
    Compute ``gram`` in float64 when deviations near roundoff matter.
    """
    gram = _check_matrix("gram", gram)
    residual = torch.linalg.matrix_norm(gram - toeplitz_projection(gram))
    total = torch.linalg.matrix_norm(gram)
    return torch.where(total > 0, residual / torch.where(total > 0, total, 1), 0)


def complex_sinusoid(
    num_positions: int,
    dim: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype = torch.complex128,
    device: Device = None,
) -> torch.Tensor:
    """The d-dimensional solution as complex numbers: ``z[m, j] = exp(i m theta_j)``.

    ``theta_j = base ** (-2 j / dim)`` for ``j = 0 .. dim/2 - 1``, the
    frequencies of Vaswani et al. (2017).  :func:`complex_to_pairs` turns it
    into the real table of Su (2021), ``[cos m theta_0, sin m theta_0, cos m
    theta_1, ...]``; the standard table interleaves ``[sin, cos]`` instead,
    which is the same table with each pair of columns swapped.

    Parameters
    ----------
    num_positions
        Number of positions ``n``; positions are ``0 .. n-1``.
    dim
        Real dimension ``d`` (even); the result has ``d/2`` complex columns.
    base
        Frequency base, > 0.
    dtype
        ``torch.complex64`` or ``torch.complex128`` (default).  Angles are
        evaluated in float64 whatever the dtype.
    device
        Device of the result.

    Returns
    -------
    Complex tensor ``(num_positions, dim // 2)``.
    """
    num_positions = check_int("num_positions", num_positions, minimum=1)
    dim = check_even("dim", dim)
    base = check_float("base", base, positive=True)
    if dtype not in (torch.complex64, torch.complex128):
        raise TypeError(f"dtype must be torch.complex64 or torch.complex128, got {dtype}")
    real = torch.float64 if dtype == torch.complex128 else torch.float32
    inv_freq = sinusoidal_inv_freq(dim, base=base, device=device)
    cos, sin = cos_sin(None, inv_freq, num_positions=num_positions, dtype=real)
    return torch.complex(cos, sin)


def pairs_to_complex(table: torch.Tensor) -> torch.Tensor:
    """Read consecutive pairs of columns as complex numbers: ``(x_2j, x_2j+1) -> x_2j + i x_2j+1``.

    ``table`` is a real ``(..., d)`` tensor with ``d`` even (interleaved
    layout); the result is ``(..., d/2)``, complex128 for float64 input and
    complex64 otherwise (float32 at least, never lower).
    """
    table = check_tensor("table", table, min_dim=1)
    if not table.is_floating_point():
        raise TypeError(f"table must be a real floating tensor, got dtype {table.dtype}")
    check_even("table.shape[-1]", table.shape[-1])
    if table.dtype != torch.float64:
        table = table.float()
    pairs = table.unflatten(-1, (-1, 2))
    return torch.complex(pairs[..., 0], pairs[..., 1])


def complex_to_pairs(z: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pairs_to_complex`: complex ``(..., h)`` -> real ``(..., 2h)``.

    Columns are interleaved ``[Re z_0, Im z_0, Re z_1, ...]``, in the real dtype matching ``z``.
    """
    z = check_tensor("z", z, min_dim=1)
    if not z.is_complex():
        raise TypeError(f"z must be a complex tensor, got dtype {z.dtype}")
    return torch.view_as_real(z).flatten(-2)


def polar_from_gram(gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve ``G[m, n] = p_m conj(p_n)`` for the moduli and the phase steps of ``p``.

    This is the derivation's argument run on numbers: the diagonal gives
    ``r_m = sqrt(G[m, m])`` and the first sub-diagonal gives
    ``phi_m - phi_{m-1} = arg G[m, m-1]``.  When ``G`` depends only on
    ``m - n`` (a Toeplitz matrix) both come out constant: a constant modulus
    and phases in arithmetic progression.

    Parameters
    ----------
    gram
        Complex ``(..., n, n)`` Hermitian Gram matrix ``z[:, None] * z.conj()``
        (``n >= 2``).

    Returns
    -------
    modulus
        Real ``(..., n)``: ``r_m``.
    phase_step
        Real ``(..., n-1)``: ``phi_m - phi_{m-1}`` in ``(-pi, pi]``, for ``m = 1 .. n-1``.
    """
    gram = check_tensor("gram", gram, min_dim=2)
    if not gram.is_complex():
        raise TypeError(f"gram must be a complex tensor, got dtype {gram.dtype}")
    n = gram.shape[-1]
    if gram.shape[-2] != n or n < 2:
        raise ValueError(f"gram must be square (..., n, n) with n >= 2, got {tuple(gram.shape)}")
    modulus = gram.diagonal(dim1=-2, dim2=-1).real.clamp_min(0).sqrt()
    phase_step = gram.diagonal(offset=-1, dim1=-2, dim2=-1).angle()
    return modulus, phase_step


def fit_relative_solution(
    num_positions: int, *, steps: int = 200, seed: int = 0, device: Device = None
) -> torch.Tensor:
    """Find ``p`` with ``p_m conj(p_n)`` depending only on ``m - n``, by optimisation.

    Fixes ``p_0 = 1`` (the phase and scale of a solution are free), starts
    ``p_1 .. p_{n-1}`` at random complex numbers and minimises
    ``toeplitz_distance(p p^*) ** 2`` with L-BFGS in float64.  The optimiser
    knows nothing of the closed form, so what it converges to is an
    independent check of the derivation: a constant modulus and a constant
    phase step (:func:`polar_from_gram`).  Like any local optimiser it can
    stall away from a solution (e.g. when one ``|p_m|`` runs off to dominate
    the others), so check ``toeplitz_distance`` of the result before using it.

    Parameters
    ----------
    num_positions
        Number of positions ``n >= 2``.
    steps
        Maximum number of L-BFGS iterations.
    seed
        Seed of the CPU generator for the random start.
    device
        Device of the computation and of the result.

    Returns
    -------
    Complex128 tensor ``(num_positions,)`` with ``p_0 = 1``.
    """
    num_positions = check_int("num_positions", num_positions, minimum=2)
    steps = check_int("steps", steps, minimum=1)
    seed = check_int("seed", seed)
    gen = torch.Generator().manual_seed(seed)
    start = torch.randn(num_positions - 1, 2, generator=gen, dtype=torch.float64)
    x = start.to(device).requires_grad_(True)
    one = torch.ones(1, dtype=torch.complex128, device=x.device)
    opt = torch.optim.LBFGS(
        [x],
        max_iter=steps,
        tolerance_grad=1e-15,
        tolerance_change=1e-20,
        history_size=50,
        line_search_fn="strong_wolfe",
    )

    def solution() -> torch.Tensor:
        return torch.cat([one, torch.view_as_complex(x)])

    def closure() -> torch.Tensor:
        opt.zero_grad()
        z = solution()
        loss = toeplitz_distance(z[:, None] * z.conj()[None, :]) ** 2
        loss.backward()
        return loss

    opt.step(closure)
    return solution().detach()
