"""Rotary position embedding, RoPE (Su et al., 2021).

RoPE rotates each pair of query/key features by an angle proportional to the
token's position, ``p * omega_i`` with ``omega_i = base**(-2i/r)`` for pair
``i`` of the ``r`` rotated features.  A rotation by ``m * omega`` of the query
and ``n * omega`` of the key leaves ``<R_m q, R_n k> = <q, R_{n-m} k>``: the
score sees only the relative position ``n - m`` (key minus query).

Conventions
-----------
* ``x`` has shape ``(..., seq, dim)``; positions are integers ``(seq,)`` or
  broadcastable ``(..., seq)``, by default ``0 .. seq-1``.
* Rotation direction: the pair ``(a, b)`` at angle ``t`` becomes
  ``(a cos t - b sin t, a sin t + b cos t)``, i.e. ``a + ib`` times ``e^{it}``
  (counter-clockwise, as in RoFormer's equation 14).
* Layouts: ``"interleaved"`` pairs features ``(2i, 2i+1)`` (RoFormer, GPT-J,
  Meta's LLaMA); ``"half"`` pairs ``(i, i + r/2)`` (GPT-NeoX, LLaMA in Hugging
  Face transformers).  Both give the same scores once the projection weights
  are permuted, see :mod:`posenc.convert`.
* ``rotary_dim=r`` rotates only the first ``r`` features, with frequencies
  computed from ``r`` (GPT-NeoX's partial rotary); the rest pass through.
* Precision: angles and cos/sin tables are computed in float64 or by exact
  angle addition (:mod:`posenc._angles`), never in bf16/fp16.  The rotation of
  a bf16/fp16 tensor runs in float32 and is rounded once, so the output is
  within 2x the bf16 rounding floor of the exact result at any position.
* A :class:`posenc.RopeScaling` changes the frequencies; its
  ``attention_factor`` (YaRN's temperature) is folded into the cos/sin tables,
  so the rotated tensor is ``attention_factor * R_p x``.
"""

from __future__ import annotations

import torch
from torch import nn

from . import _memory
from ._angles import compute_dtype, cos_sin
from ._checks import as_positions, check_choice, check_even, check_float, check_floating, check_int
from .scaling import RopeScaling
from .scheme import PositionalScheme
from .sinusoidal import sinusoidal_inv_freq

__all__ = ["rope_frequencies", "rope_cos_sin", "apply_rope", "RotaryEmbedding"]

LAYOUTS = ("interleaved", "half")

# Elements of float32 scratch per chunk in the bf16/fp16 and "half" paths (1 MiB):
# small enough to stay in a per-core L2, so memory traffic is one read and one
# write of x; large enough that Python's per-chunk overhead stays small.
_CHUNK_ELEMENTS = 1 << 18


def rope_frequencies(
    dim: int,
    *,
    base: float = 10000.0,
    scaling: RopeScaling | None = None,
    seq_len: int | None = None,
) -> torch.Tensor:
    """RoPE frequencies ``omega_i = base**(-2i/dim)``, then the scaling, as float64 ``(dim // 2,)``.

    Parameters
    ----------
    dim
        Number of rotated features (even).
    base
        Frequency base (10000 in RoFormer; 500000 in Llama 3).
    scaling
        Optional :class:`posenc.RopeScaling`.
    seq_len
        Current context length; used by dynamic NTK only.

    Returns
    -------
    Tensor of shape ``(dim // 2,)``, float64, on the CPU, in radians per position.
    """
    dim = check_even("dim", dim)
    base = check_float("base", base, positive=True)
    scaling = _check_scaling(scaling)
    if seq_len is not None:
        seq_len = check_int("seq_len", seq_len, minimum=0)
    if scaling is None:
        return sinusoidal_inv_freq(dim, base=base)
    return scaling.frequencies(dim, base, seq_len)


def rope_cos_sin(
    positions,
    dim: int,
    *,
    base: float = 10000.0,
    scaling: RopeScaling | None = None,
    dtype: torch.dtype = torch.float32,
    device=None,
    seq_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables ``cos(p * omega_i)`` and ``sin(p * omega_i)``, each ``(*positions.shape, dim // 2)``.

    Parameters
    ----------
    positions
        Integer positions: a tensor, a ``range`` or a sequence of ints.  A
        contiguous run (a ``range`` with step 1, or a 1-D CPU tensor that is
        one) takes the fast exact angle-addition path; anything else is
        evaluated in float64.
    dim
        Number of rotated features (even).
    base, scaling
        As in :func:`rope_frequencies`.  The scaling's ``attention_factor``
        multiplies both tables (1 except for YaRN).
    dtype
        Floating dtype of the tables; values are correctly rounded from
        float32 or better whatever ``dtype`` is.
    device
        Device of the tables; defaults to the positions' device (CPU for
        ranges and lists).
    seq_len
        Context length seen by dynamic NTK; defaults to ``max(positions) + 1``.
    """
    dim = check_even("dim", dim)
    scaling = _check_scaling(scaling)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    start, count, pos = _split_positions(positions, device)
    if device is None:
        device = pos.device if pos is not None else torch.device("cpu")
    if seq_len is None and scaling is not None and scaling.kind == "dynamic_ntk":
        seq_len = start + count if pos is None else int(pos.max()) + 1 if pos.numel() else 0
    omega = rope_frequencies(dim, base=base, scaling=scaling, seq_len=seq_len).to(device)
    work = compute_dtype(dtype)
    cos, sin = cos_sin(pos, omega, num_positions=count, start=start, dtype=work)
    if scaling is not None and scaling.attention_factor != 1.0:
        cos, sin = cos * scaling.attention_factor, sin * scaling.attention_factor
    return cos.to(dtype), sin.to(dtype)


def apply_rope(
    x: torch.Tensor,
    positions=None,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    rotary_dim: int | None = None,
    scaling: RopeScaling | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate ``x`` by its positions: RoPE applied to queries or keys.

    Parameters
    ----------
    x
        Queries or keys, ``(..., seq, dim)``, any floating dtype and device.
    positions
        Integer positions ``(seq,)`` or broadcastable ``(..., seq)``; default
        ``0 .. seq-1``.  Float positions raise ``TypeError``.
    base
        Frequency base.
    layout
        ``"interleaved"`` pairs features ``(2i, 2i+1)``; ``"half"`` pairs
        ``(i, i + r/2)``.  See the module docstring.  On CPU "interleaved" is
        the faster (one complex multiply); a half-layout checkpoint can use
        it after :func:`posenc.half_to_interleaved` on its q/k projections.
    rotary_dim
        Rotate only the first ``r`` features (even, ``<= dim``); frequencies
        use ``r``.  Defaults to ``dim``.
    scaling
        Optional :class:`posenc.RopeScaling`; its ``attention_factor`` scales
        the rotated features (YaRN).
    out
        Optional preallocated contiguous output with the shape, dtype and
        device of ``x`` (may be ``x`` itself).  Not allowed when ``x`` needs
        gradients.

    Returns
    -------
    Tensor shaped and typed like ``x``.  Pair ``(a, b)`` at angle ``t`` becomes
    ``(a cos t - b sin t, a sin t + b cos t)``.
    """
    x, rotary_dim = _check_x(x, layout, rotary_dim)
    seq = x.shape[-2]
    work = compute_dtype(x.dtype)
    if positions is None:
        cos, sin = rope_cos_sin(
            range(seq), rotary_dim, base=base, scaling=scaling, dtype=work, device=x.device
        )
    else:
        pos = _check_positions(positions, x)
        cos, sin = rope_cos_sin(
            pos, rotary_dim, base=base, scaling=scaling, dtype=work, device=x.device
        )
    return _rotate(x, cos, sin, layout, rotary_dim, out)


class RotaryEmbedding(nn.Module, PositionalScheme):
    """RoPE with a cached cos/sin table; also a :class:`posenc.PositionalScheme`.

    ``module(x, positions=None)`` equals :func:`apply_rope` with the module's
    settings.  Used as ``posenc.attention(q, k, v, encoding=module)`` it
    rotates queries at ``q_offset .. q_offset+q_len-1`` and keys at
    ``0 .. k_len-1`` (KV-cache alignment, see :mod:`posenc.attention`) and
    never builds an O(q_len * k_len) bias.

    The cache
    ---------
    * It is a plain attribute, not a buffer: ``module.to(torch.bfloat16)``
      cannot round it, and the frequencies stay float64 (RoPE has no
      parameters, so there is nothing else to cast).
    * It holds float32 tables (float64 for float64 inputs) on the device of
      the last input; a new device or precision rebuilds it ("re-keying").
    * It regrows (doubling) when a position beyond its length is requested,
      so there is no maximum sequence length.  With dynamic NTK the table
      depends on the current length and is rebuilt when that changes.

    Parameters
    ----------
    dim
        Feature size of queries/keys (even).
    base, layout, rotary_dim, scaling
        As in :func:`apply_rope`.
    max_positions
        Initial cache length (a hint; the cache grows as needed).
    """

    materializes_bias = False

    def __init__(
        self,
        dim: int,
        *,
        base: float = 10000.0,
        layout: str = "interleaved",
        rotary_dim: int | None = None,
        scaling: RopeScaling | None = None,
        max_positions: int = 2048,
    ):
        nn.Module.__init__(self)
        self.dim = check_even("dim", dim)
        self.rotary_dim = _check_rotary_dim(rotary_dim, self.dim)
        self.base = check_float("base", base, positive=True)
        self.layout = check_choice("layout", layout, LAYOUTS)
        self.scaling = _check_scaling(scaling)
        self.max_positions = check_int("max_positions", max_positions, minimum=1)
        # float64 frequencies as a plain attribute: immune to module.to(dtype)
        self.inv_freq = rope_frequencies(self.rotary_dim, base=self.base, scaling=self.scaling)
        self._cache = None  # (cos, sin, freq_len); cos/sin (length, rotary_dim // 2)

    def forward(self, x: torch.Tensor, positions=None, *, out=None) -> torch.Tensor:
        """Rotate ``x`` ``(..., seq, dim)`` at ``positions`` (default ``0 .. seq-1``)."""
        x, _ = _check_x(x, self.layout, self.rotary_dim)
        if x.shape[-1] != self.dim:
            raise ValueError(f"x must have last dimension dim={self.dim}, got {x.shape[-1]}")
        if positions is not None:
            positions = _check_positions(positions, x)
        cos, sin = self.cos_sin(x.shape[-2] if positions is None else positions, x)
        return _rotate(x, cos, sin, self.layout, self.rotary_dim, out)

    def rotate(self, q, k, q_positions, k_positions):
        """:class:`posenc.PositionalScheme` hook: rotate ``q`` and ``k`` at their positions."""
        if q.shape[-1] != self.dim:
            raise ValueError(f"q and k must have last dimension dim={self.dim}, got {q.shape[-1]}")
        # one table for both, so that q and k share the frequencies (dynamic NTK)
        n = max(int(q_positions.max()), int(k_positions.max())) + 1
        low = min(int(q_positions.min()), int(k_positions.min()))
        cq, sq = self.cos_sin(q_positions, q, length=n, lowest=low)
        ck, sk = self.cos_sin(k_positions, k, length=n, lowest=low)
        return (
            _rotate(q, cq, sq, self.layout, self.rotary_dim, None),
            _rotate(k, ck, sk, self.layout, self.rotary_dim, None),
        )

    def cos_sin(self, positions, like: torch.Tensor, *, length=None, lowest=None):
        """Tables ``(..., seq, rotary_dim // 2)`` for ``like``'s device, in float32 or float64.

        ``positions`` is an integer tensor or a count ``seq`` (meaning ``0 .. seq-1``).
        ``length`` (default ``max(positions) + 1``) is the context length used
        for the cache size and for dynamic NTK.
        """
        work = compute_dtype(like.dtype)
        if isinstance(positions, int):
            n, lowest = positions, 0
        else:
            n = length if length is not None else int(positions.max()) + 1
            lowest = lowest if lowest is not None else int(positions.min())
        if lowest < 0:  # outside any cache: evaluate directly in float64
            return rope_cos_sin(
                positions,
                self.rotary_dim,
                base=self.base,
                scaling=self.scaling,
                dtype=work,
                device=like.device,
                seq_len=n,
            )
        cos, sin = self._table(n, like.device, work)
        if isinstance(positions, int):
            return cos[:n], sin[:n]
        return cos[positions], sin[positions]

    def _table(self, n: int, device, dtype):
        """Cached tables; rebuilt on a new device/dtype, a longer context or a new NTK length."""
        dynamic = self.scaling is not None and self.scaling.kind == "dynamic_ntk"
        freq_len = n if dynamic and n > self.scaling.original_max_positions else None
        c = self._cache
        if (
            c is None
            or c[0].device != device
            or c[0].dtype != dtype
            or c[0].shape[0] < n
            or c[2] != freq_len
        ):
            old = 0 if c is None else c[0].shape[0]
            length = n if freq_len is not None else max(n, 2 * old, self.max_positions)
            cos, sin = rope_cos_sin(
                range(length),
                self.rotary_dim,
                base=self.base,
                scaling=self.scaling,
                dtype=dtype,
                device=device,
                seq_len=n,  # <= original length unless freq_len is set: unscaled
            )
            self._cache = c = (cos, sin, freq_len)
        return c[0], c[1]

    def extra_repr(self) -> str:
        s = f"dim={self.dim}, base={self.base}, layout={self.layout!r}"
        if self.rotary_dim != self.dim:
            s += f", rotary_dim={self.rotary_dim}"
        if self.scaling is not None:
            s += f", scaling={self.scaling!r}"
        return s

    def __repr__(self) -> str:  # nn.Module's, not PositionalScheme's
        return nn.Module.__repr__(self)


# ---------------------------------------------------------------------- internals


def _rotate(x, cos, sin, layout, r, out):
    """Rotate the first ``r`` features of ``x`` by tables ``cos, sin`` ``(..., seq, r // 2)``."""
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad)
    if needs_grad:
        if out is not None:
            raise ValueError("out must be None when x requires grad (out= is not differentiable)")
        return _rotate_functional(x, cos, sin, layout, r)
    if out is None:
        out = _memory.empty(*x.shape, dtype=x.dtype, device=x.device)
    else:
        _check_out(out, x)
    if x.numel() == 0:
        return out
    if r < x.shape[-1] and out.data_ptr() != x.data_ptr():
        out[..., r:].copy_(x[..., r:])
    if x.is_cuda:
        from . import _triton_rope

        if _triton_rope.available():
            return _triton_rope.rotate(x, cos, sin, layout, r, out)
    if layout == "interleaved" and x.dtype in (torch.float32, torch.float64):
        x = x.contiguous()  # the complex view needs unit feature stride and even offsets
        # one pass: (a + ib) * (cos + i sin) on the complex view of feature pairs
        xc = torch.view_as_complex(x[..., :r].unflatten(-1, (r // 2, 2)))
        oc = torch.view_as_complex(out[..., :r].unflatten(-1, (r // 2, 2)))
        torch.mul(xc, torch.complex(cos, sin), out=oc)
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    _rotate_chunked(x, cos, sin, layout, r, out)
    return out


def _rotate_functional(x, cos, sin, layout, r):
    """Differentiable elementwise form, computed in float32 or better."""
    work = compute_dtype(x.dtype)
    xr = x[..., :r].to(work)
    if layout == "interleaved":
        a, b = xr[..., 0::2], xr[..., 1::2]
        y = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        a, b = xr[..., : r // 2], xr[..., r // 2 :]
        y = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return torch.cat((y.to(x.dtype), x[..., r:]), dim=-1)


def _rotate_chunked(x, cos, sin, layout, r, out):
    """Rotate through a cache-sized float32/float64 scratch, one chunk of rows at a time.

    Each element of ``x`` is read from memory once and each of ``out`` written
    once; the intermediate arithmetic stays in cache.  Needed for bf16/fp16
    (no complex type) and for the "half" layout (pairs are not adjacent).
    """
    seq, dim, h = x.shape[-2], x.shape[-1], r // 2
    work = cos.dtype
    lead = x.shape[:-2]
    x3 = x.reshape(-1, seq, dim)
    out3 = out.view(-1, seq, dim)
    if cos.dim() > 2 and any(s != 1 for s in cos.shape[:-2]):  # per-batch positions
        cos = cos.expand(*lead, seq, h).reshape(-1, seq, h)
        sin = sin.expand(*lead, seq, h).reshape(-1, seq, h)
        per_batch = True
    else:
        cos, sin = cos.reshape(seq, h), sin.reshape(seq, h)
        per_batch = False
    rows = max(1, _CHUNK_ELEMENTS // r)  # sequence rows per chunk
    if rows >= seq:
        nb, ns = max(1, rows // seq), seq
    else:
        nb, ns = 1, rows
    scratch = torch.empty(nb * ns * r, dtype=work, device=x.device)
    rot = torch.complex(cos, sin) if layout == "interleaved" else None
    for b0 in range(0, x3.shape[0], nb):
        b1 = min(b0 + nb, x3.shape[0])
        for s0 in range(0, seq, ns):
            s1 = min(s0 + ns, seq)
            src = x3[b0:b1, s0:s1, :r]
            dst = out3[b0:b1, s0:s1, :r]
            buf = scratch[: src.numel()].view(src.shape)
            c = cos[b0:b1, s0:s1] if per_batch else cos[s0:s1]
            s = sin[b0:b1, s0:s1] if per_batch else sin[s0:s1]
            if layout == "interleaved":
                buf.copy_(src)
                bc = torch.view_as_complex(buf.unflatten(-1, (h, 2)))
                f = rot[b0:b1, s0:s1] if per_batch else rot[s0:s1]
                bc.mul_(f)
            else:
                a, b = src[..., :h], src[..., h:]
                torch.mul(a, c, out=buf[..., :h]).addcmul_(b, s, value=-1.0)
                torch.mul(b, c, out=buf[..., h:]).addcmul_(a, s)
            dst.copy_(buf)


def _check_x(x, layout, rotary_dim):
    x = check_floating("x", x, min_dim=2)
    dim = x.shape[-1]
    if dim % 2 or dim == 0:
        raise ValueError(
            f"dim (the last dimension of x) must be a positive even integer, got {dim}"
        )
    check_choice("layout", layout, LAYOUTS)
    return x, _check_rotary_dim(rotary_dim, dim)


def _check_rotary_dim(rotary_dim, dim):
    if rotary_dim is None:
        return dim
    rotary_dim = check_even("rotary_dim", rotary_dim)
    if rotary_dim > dim:
        raise ValueError(f"rotary_dim must be <= dim={dim}, got {rotary_dim}")
    return rotary_dim


def _check_positions(positions, x):
    pos = as_positions("positions", positions, device=x.device)
    seq = x.shape[-2]
    if pos.dim() == 0 or pos.shape[-1] != seq:
        raise ValueError(
            f"positions must have shape (seq,) or (..., seq) with seq={seq} (x.shape[-2]), "
            f"got {tuple(pos.shape)}"
        )
    try:
        torch.broadcast_shapes(pos.shape, x.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"positions of shape {tuple(pos.shape)} do not broadcast against "
            f"x.shape[:-1] = {tuple(x.shape[:-1])}"
        ) from None
    return pos


def _check_out(out, x):
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"out must match x in shape, dtype and device ({tuple(x.shape)}, {x.dtype}, "
            f"{x.device}), got ({tuple(out.shape)}, {out.dtype}, {out.device})"
        )
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")


def _check_scaling(scaling):
    if scaling is not None and not isinstance(scaling, RopeScaling):
        raise TypeError(
            f"scaling must be a posenc.RopeScaling or None, got {type(scaling).__name__}"
        )
    return scaling


def _split_positions(positions, device):
    """``(start, count, None)`` for a contiguous run, else ``(0, None, int64 tensor)``."""
    if isinstance(positions, range) and positions.step == 1:
        return positions.start, max(len(positions), 0), None
    pos = as_positions("positions", positions, device=device)
    if pos.dim() == 1 and pos.device.type == "cpu" and pos.numel() > 0:
        start = int(pos[0])
        if torch.equal(pos, torch.arange(start, start + pos.numel())):
            return start, pos.numel(), None
    return 0, None, pos
