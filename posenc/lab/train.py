"""Training and evaluation loops for :class:`posenc.lab.TinyDecoder`.

Deterministic: every random draw comes from an explicit seed (model
initialisation from ``torch.manual_seed``, data from a
:class:`torch.Generator`), so a run is repeatable on one machine and thread
count, and agrees to roundoff across thread counts.

Progress bars use ``tqdm`` when ``progress=True``; it is imported only then.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol, TypeAlias, Union, overload

import torch
import torch.nn.functional as F

from .._checks import check_float, check_int
from ..scheme import PositionalScheme
from .tasks import LanguageTask, RecallTask, RetrievalTask

__all__ = [
    "seed_for", "train", "last_step", "evaluate_loss", "evaluate_accuracy", "peak_memory_mb",
]  # fmt: skip

# The lab's tasks: each makes (inputs, targets, weights) with batch(batch, length, generator).
_Task: TypeAlias = Union[LanguageTask, RetrievalTask, RecallTask]  # noqa: UP007


def seed_for(*parts: object) -> int:
    """A stable 31-bit seed from any printable parts (independent of run order and hashing).

    The lab derives every model's and every batch's seed this way, from the run's
    seed and names (``seed_for(config.seed, "data", task, scheme, ...)``), so a
    model gets the same seed whatever else runs before it.

    Parameters
    ----------
    *parts
        Values whose ``repr`` is stable (ints, strings, floats, tuples of them):
        the seed is the CRC-32 of ``repr(parts)``, so ``0`` and ``"0"`` give
        different seeds.

    Returns
    -------
    An int in ``0 .. 2**31 - 1``, the same in every process and on every machine
    (unlike ``hash``, which Python salts per process for strings).

    Examples
    --------
    >>> from posenc.lab import seed_for
    >>> seed_for(0, "curse")
    618889170
    >>> seed_for(0, "curse") == seed_for(1, "curse")
    False
    """
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def peak_memory_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux and macOS).

    The high-water mark of the resident set size (``ru_maxrss`` of
    ``resource.getrusage(RUSAGE_SELF)``: KiB on Linux, bytes on macOS): it never
    decreases, and it counts this process only, not its worker processes.  Needs
    the ``resource`` module, which Windows lacks (``ImportError`` there).

    Returns
    -------
    The peak in MiB (``2**20`` bytes), a float.
    """
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class _Bar(Protocol):
    """What the loop uses of a tqdm progress bar."""

    def update(self) -> object: ...
    def set_postfix(self, **kwargs: Any) -> None: ...
    def close(self) -> None: ...


def _bar(total: int, desc: str, progress: bool) -> _Bar | None:
    if not progress:
        return None
    from tqdm.auto import tqdm  # type: ignore[import-untyped]  # tqdm ships no types

    bar: _Bar = tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)
    return bar


def train(
    model: torch.nn.Module,
    task: _Task,
    *,
    length: int,
    steps: int,
    batch: int,
    lr: float = 3e-3,
    seed: int = 0,
    log_every: int = 10,
    progress: bool = False,
    desc: str = "train",
    warmup: int | None = None,
    callback: Callable[[int], object] | None = None,
    callback_every: int = 250,
    compiled: bool = False,
) -> list[float]:
    """Train ``model`` on ``task`` at ``length`` with AdamW and a cosine schedule.

    Each step draws ``batch`` fresh sequences of ``length`` tokens from
    ``task`` and minimises the mean cross-entropy over the scored tokens
    (``weights`` of 1), with AdamW (no weight decay) and gradients clipped to
    norm 1.  The learning rate rises linearly over ``warmup`` steps to ``lr``,
    then follows a cosine to 0 at ``steps``.  The data is drawn on the CPU from
    a :class:`torch.Generator` seeded with ``seed`` and moved to the device of
    the model's parameters, so a seed gives the same data on any device; the
    initialisation is the caller's (``torch.manual_seed`` before building the
    model).  The model is left in eval mode.

    Under ``torchrun`` (an initialised ``torch.distributed`` process group with
    more than one process) the model is wrapped in DistributedDataParallel:
    every process draws the same global batch of ``batch`` sequences (divisible
    by the number of processes) and trains on its share, so the losses and the
    updates equal one process's within rounding.

    Parameters
    ----------
    model
        Maps int64 tokens ``(batch, length)`` to logits ``(batch, length, vocab)``,
        such as a :class:`TinyDecoder`; when it has a ``check_length`` method (a
        :class:`TinyDecoder` does), ``length`` is checked with it first.
    task
        A :class:`LanguageTask`, :class:`RetrievalTask` or :class:`RecallTask`:
        its ``batch(batch, length, generator)`` gives ``(inputs, targets, weights)``.
    length
        Tokens per training sequence (``>= 1``).
    steps
        Optimiser steps (``>= 0``; 0 leaves the model as it is).
    batch
        Sequences per step (``>= 1``).
    lr
        Peak learning rate (``> 0``; default ``3e-3``).
    seed
        Seed of the training data (default 0).
    log_every
        Steps per value of the returned curve (default 10).
    progress
        Show a ``tqdm`` progress bar (in the first process only); ``tqdm`` is
        imported only then.
    desc
        The progress bar's label.
    warmup
        Warmup steps (``>= 1``); default ``max(1, steps // 20)``.  Pass it to
        hold the warmup fixed when only the budget changes.
    callback
        Called as ``callback(step)`` (``step`` = steps done) after every
        ``callback_every`` steps; it may evaluate the model (training resumes in
        train mode) but must not draw from the training data.
    callback_every
        Steps between calls of ``callback`` (``>= 1``; default 250).
    compiled
        Take the compiled step (default ``False``: the eager step, which made
        the stored results): the forward pass and the loss run as one graph
        compiled by ``torch.compile`` (Inductor; its backward is compiled too,
        and the schemes run their eager attention paths inside it), and AdamW
        takes its fused kernel.  The same step in exact arithmetic; the
        rounding differs (another summation order), so a run is not bitwise
        the eager run but is as deterministic (same seed, same threads, same
        numbers).  One process compiles each model structure once (seconds
        to minutes on a small CPU, less with Inductor's on-disk cache warm;
        later models of the same scheme and shapes reuse it), so it pays over
        thousands of steps, not over tens.  A model whose step fails to
        compile (or a machine without a compiler) trains with the eager
        forward pass instead, with a ``RuntimeWarning`` naming the scheme and
        the error, and ``posenc.lab.train.last_step()`` says so.  Under
        ``torchrun`` the step stays eager.

    Returns
    -------
    The mean training loss (nats per scored token) of each block of ``log_every``
    steps, the last block possibly shorter: ``ceil(steps / log_every)`` floats.
    """
    length = check_int("length", length, minimum=1)
    steps = check_int("steps", steps, minimum=0)
    batch = check_int("batch", batch, minimum=1)
    lr = check_float("lr", lr, positive=True)
    log_every = check_int("log_every", log_every, minimum=1)
    callback_every = check_int("callback_every", callback_every, minimum=1)
    check_length = getattr(model, "check_length", None)  # a TinyDecoder's
    if check_length is not None:
        check_length(length, "length")
    if not isinstance(compiled, bool):
        raise TypeError(f"compiled must be a bool, got {type(compiled).__name__}")
    generator = torch.Generator().manual_seed(seed)
    net, rank, world = _distributed(model, batch)
    fast = _CompiledLoss(model, length, batch) if compiled and world == 1 else None
    # the fused AdamW kernel: one pass over every parameter instead of a dozen foreach ops
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=fast is not None)
    warmup = max(1, steps // 20) if warmup is None else check_int("warmup", warmup, minimum=1)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model.train()
    curve: list[float] = []
    block: list[float] = []
    bar = _bar(steps, desc, progress and rank == 0)
    for step in range(steps):
        # every process draws the same global batch and keeps its own rows
        inputs, targets, weights = _on(model, task.batch(batch, length, generator))
        total = weights.sum()
        rows = slice(rank * batch // world, (rank + 1) * batch // world)
        inputs, targets, weights = inputs[rows], targets[rows], weights[rows]
        opt.zero_grad(set_to_none=True)
        if fast is not None:
            local = fast.backward(inputs, targets, weights, total)
        else:
            local = _loss(net(inputs), targets, weights).sum() / total
            # DDP averages gradients over processes: world * local averages to the global loss
            (local * world).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss = local.detach()
        if world > 1:
            torch.distributed.all_reduce(loss)
        block.append(loss.item())
        if len(block) == log_every:
            curve.append(math.fsum(block) / len(block))
            block = []
        if bar is not None:
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if callback is not None and (step + 1) % callback_every == 0:
            callback(step + 1)
            model.train()
    if block:
        curve.append(math.fsum(block) / len(block))
    if bar is not None:
        bar.close()
    model.eval()
    global _last_step
    _last_step = "eager" if fast is None else fast.kind
    return curve


# How the last call of train() in this process stepped (see last_step).
_last_step = "eager"


def last_step() -> str:
    """How the last :func:`train` call of this process took its steps.

    Returns
    -------
    ``"eager"``, ``"compiled"``, or ``"eager (compile failed: ...)"`` when
    ``train(..., compiled=True)`` fell back to the eager forward pass (the
    error follows the colon).

    Examples
    --------
    >>> import torch
    >>> from posenc.lab import LanguageTask, TinyDecoder, train
    >>> from posenc.lab.train import last_step
    >>> task = LanguageTask()
    >>> _ = torch.manual_seed(0)
    >>> model = TinyDecoder(task.vocab, "rope", 8, d_model=16, heads=2)
    >>> curve = train(model, task, length=8, steps=2, batch=4)
    >>> last_step()
    'eager'
    """
    return _last_step


def _loss_sum(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    total: torch.Tensor,
) -> torch.Tensor:
    """The training loss: the step's weighted cross-entropy over its scored tokens."""
    return _loss(model(inputs), targets, weights).sum() / total


# Inductor inlines a pointwise computation into every kernel that reads it unless it has
# more ops than its realize_opcount_threshold (30).  The sine tables of the rotating
# schemes (RoPE's cos and sin of float64 angles) and of Transformer-XL's relative
# embeddings are functions of the positions only; inlined, they are recomputed for every
# batch row and head, forward and backward, in scalar loops.  A threshold of 4 stores
# them once (measured at the full preset's size, CPU time per step: RoPE 23 -> 18 ms,
# xPos 20 -> 18 ms, Transformer-XL 24 -> 21 ms).  For the other schemes it changed
# nothing (NoPE, ALiBi, T5) or cost time (FIRE 17 -> 20 ms, CoPE 17.7 -> 18.4 ms: their
# pointwise chains are better inlined), so only these take it.
_REALIZE_OPCOUNT_TABLES = 4


def _sine_tables(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds a scheme that builds sine tables in its forward pass: one
    that rotates (RoPE, xPos, p-RoPE) or Transformer-XL's."""
    from ..transformer_xl import TransformerXLScheme

    return any(
        isinstance(m, TransformerXLScheme)
        or (isinstance(m, PositionalScheme) and type(m).rotate is not PositionalScheme.rotate)
        for m in model.modules()
    )


class _CompiledLoss:
    """The compiled forward pass and loss of one :func:`train` call, with its eager fallback.

    One compiled region per model structure (the class, the scheme and its
    settings, the parameters' shapes, the batch's shape): models of the same
    structure (other seeds) reuse its graph, since Dynamo passes the
    parameters in as inputs.
    """

    def __init__(self, model: torch.nn.Module, length: int, batch: int) -> None:
        from .. import _compile

        self.model = model
        self.kind = "compiled"
        device = next(model.parameters()).device.type
        why = _compile.missing_compiler(device)
        shapes = tuple((n, tuple(p.shape), p.dtype) for n, p in model.named_parameters())
        # (first the device type: the region compiles for it; last whether it has tables)
        self.key: tuple[object, ...] = (
            device, "posenc.lab.train", type(model), repr(model), shapes, length, batch,
            _sine_tables(model),
        )  # fmt: skip
        if why is not None:
            self._fail(why)

    def backward(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        weights: torch.Tensor,
        total: torch.Tensor,
    ) -> torch.Tensor:
        """The step's loss, its gradients accumulated into the parameters."""
        if self.kind == "compiled":
            try:
                local = _region(self.key)(self.model, inputs, targets, weights, total)
                local.backward()
                return local
            except Exception as err:  # noqa: BLE001  # any compiler failure: train eagerly
                self._fail(err)
        local = _loss_sum(self.model, inputs, targets, weights, total)
        local.backward()
        return local

    def _fail(self, err: Exception | str) -> None:
        import warnings

        for p in self.model.parameters():  # a failure in the backward leaves partial gradients
            p.grad = None
        if isinstance(err, str):
            message = err
        else:
            message = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        self.kind = f"eager (compile failed: {message})"
        scheme = getattr(self.model, "scheme", type(self.model).__name__)
        warnings.warn(
            f"train(compiled=True): the step of scheme {scheme!r} did not compile "
            f"({message}); it trains with the eager forward pass",
            RuntimeWarning,
            stacklevel=4,
        )
        _regions_failed.add(self.key)


# Compiled regions of the training loss, by model structure; structures that failed.
_regions: dict[tuple[object, ...], Callable[..., torch.Tensor]] = {}
_regions_failed: set[tuple[object, ...]] = set()


def _region(key: tuple[object, ...]) -> Callable[..., torch.Tensor]:
    """The compiled training loss for one model structure (posenc's compile rules:
    ``posenc._compile``, with a fresh code object per region)."""
    from .. import _compile

    if key in _regions_failed:
        raise RuntimeError("this model structure failed to compile before")
    fn = _regions.get(key)
    if fn is None:
        opts = _compile.compile_options(str(key[0]))
        if key[-1]:  # sine tables: stored once (see _REALIZE_OPCOUNT_TABLES)
            opts["options"] = {
                **opts.get("options", {}),
                "realize_opcount_threshold": _REALIZE_OPCOUNT_TABLES,
            }
        fn = torch.compile(_compile._fresh_copy(_loss_sum, "posenc_lab_train_loss"), **opts)
        _regions[key] = fn
    return fn


def _distributed(model: torch.nn.Module, batch: int) -> tuple[torch.nn.Module, int, int]:
    """``(net, rank, world)``: ``model`` wrapped in DDP when a process group with more than
    one process is initialised, else ``(model, 0, 1)``."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return model, 0, 1
    world = dist.get_world_size()
    if batch % world:
        raise ValueError(f"batch must be divisible by the number of processes {world}, got {batch}")
    return torch.nn.parallel.DistributedDataParallel(model), dist.get_rank(), world


def _on(model: torch.nn.Module, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """``tensors`` on the model's device (data is always drawn on the CPU, so a seed
    gives the same data on every device)."""
    device = next(model.parameters()).device
    return tuple(t.to(device) for t in tensors)


def _loss(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-position cross-entropy ``(batch, length)``, zero where ``weights`` is 0."""
    b, n, v = logits.shape
    ce = F.cross_entropy(logits.reshape(b * n, v).float(), targets.reshape(-1), reduction="none")
    return ce.view(b, n) * weights


def _chunks(total: int, size: int) -> Iterator[int]:
    for start in range(0, total, size):
        yield min(size, total - start)


# The overloads spell the task's type out rather than use _Task: the reference shows
# their signatures, and autodoc evaluates their annotations in the globals of the
# documented object, torch.no_grad's wrapper (torch's module), where _Task is unknown;
# left as text, it is a reference to a private name that the strict book build refuses.
@overload
def evaluate_loss(
    model: torch.nn.Module,
    task: LanguageTask | RetrievalTask | RecallTask,
    length: int,
    *,
    sequences: int,
    seed: int,
    max_batch: int = ...,
    name: str = ...,
    per_sequence: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def evaluate_loss(
    model: torch.nn.Module,
    task: LanguageTask | RetrievalTask | RecallTask,
    length: int,
    *,
    sequences: int,
    seed: int,
    max_batch: int = ...,
    name: str = ...,
    per_sequence: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def evaluate_loss(
    model: torch.nn.Module,
    task: LanguageTask | RetrievalTask | RecallTask,
    length: int,
    *,
    sequences: int,
    seed: int,
    max_batch: int = ...,
    name: str = ...,
    per_sequence: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


@torch.no_grad()
def evaluate_loss(
    model: torch.nn.Module,
    task: _Task,
    length: int,
    *,
    sequences: int,
    seed: int,
    max_batch: int = 8,
    name: str = "length",
    per_sequence: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mean loss at every input position over ``sequences`` fresh samples: float64 ``(length,)``.

    The samples are drawn from ``task`` with a :class:`torch.Generator` seeded
    with ``seed`` (on the CPU), so every model evaluated with the same ``seed``
    sees the same sequences.  The model is put in eval mode and run without
    gradients.  Sequences are processed ``max_batch`` at a time, so memory grows
    with ``max_batch * length**2`` at most (the attention weights), never with
    ``sequences``.

    Parameters
    ----------
    model
        Maps int64 tokens ``(batch, length)`` to logits ``(batch, length, vocab)``;
        when it has a ``check_length`` method (a :class:`TinyDecoder` does), it
        raises ``ValueError`` naming ``name`` when the model cannot run on
        ``length`` (a learned table past its rows).
    task
        A :class:`LanguageTask`, :class:`RetrievalTask` or :class:`RecallTask`.
    length
        Tokens per sequence (``>= 1``).
    sequences
        Number of sequences (``>= 1``).
    seed
        Seed of the evaluation data.
    max_batch
        Sequences per forward pass (default 8).
    name
        How ``length`` is named in error messages (default ``"length"``).
    per_sequence
        Also return each sequence's mean loss.

    Returns
    -------
    The cross-entropy (nats) at each position, averaged over the sequences:
    float64 ``(length,)``, 0 where the task scores nothing (``weights`` of 0).
    With ``per_sequence=True``, ``(per_position, per_sequence)``: also each
    sequence's mean over its positions, float64 ``(sequences,)`` (their spread
    is the evaluation noise).
    """
    length = check_int(name, length, minimum=1)
    sequences = check_int("sequences", sequences, minimum=1)
    check_length = getattr(model, "check_length", None)  # a TinyDecoder's
    if check_length is not None:
        check_length(length, name)
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    total = torch.zeros(length, dtype=torch.float64)
    each: list[torch.Tensor] = []
    for size in _chunks(sequences, max_batch):
        inputs, targets, weights = _on(model, task.batch(size, length, generator))
        ce = _loss(model(inputs), targets, weights).to("cpu", torch.float64)
        total += ce.sum(0)
        each.append(ce.mean(1))
    if per_sequence:
        return total / sequences, torch.cat(each)
    return total / sequences


@torch.no_grad()
def evaluate_accuracy(
    model: torch.nn.Module,
    task: RetrievalTask,
    length: int,
    distances: tuple[int, int],
    *,
    sequences: int,
    seed: int,
    max_batch: int = 8,
    name: str = "length",
) -> float:
    """Fraction of ``sequences`` retrieval samples whose value the model names (argmax).

    The samples are drawn from ``task`` with a :class:`torch.Generator` seeded
    with ``seed`` (on the CPU); the model is put in eval mode and run without
    gradients, ``max_batch`` sequences at a time.  A sample counts as named when,
    at the last position (the query), the largest logit among the value tokens
    is the hidden value's: other tokens are never guessed, so chance is
    ``1 / task.passkey.values``.

    Parameters
    ----------
    model
        Maps int64 tokens ``(batch, length)`` to logits ``(batch, length, vocab)``;
        when it has a ``check_length`` method (a :class:`TinyDecoder` does), it
        raises ``ValueError`` naming ``name`` when the model cannot run on
        ``length``.
    task
        A :class:`RetrievalTask`.
    length
        Tokens per sequence, query included (``>= 2``).
    distances
        ``(lo, hi)``: the value sits ``d`` tokens before the query, ``d`` uniform
        on ``lo .. hi`` (both included, ``1 <= lo <= hi <= length - 1``).
    sequences
        Number of samples (``>= 1``).
    seed
        Seed of the evaluation data.
    max_batch
        Sequences per forward pass (default 8).
    name
        How ``length`` is named in error messages (default ``"length"``).

    Returns
    -------
    The fraction of samples named correctly, a float in ``[0, 1]``.
    """
    length = check_int(name, length, minimum=2)
    sequences = check_int("sequences", sequences, minimum=1)
    check_length = getattr(model, "check_length", None)  # a TinyDecoder's
    if check_length is not None:
        check_length(length, name)
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    lo = task.passkey.fillers
    hi = lo + task.passkey.values
    correct = 0
    for size in _chunks(sequences, max_batch):
        inputs, targets, _ = _on(model, task.batch(size, length, generator, distances))
        guess = model(inputs)[:, -1, lo:hi].argmax(-1) + lo
        correct += int((guess == targets[:, -1]).sum())
    return correct / sequences
