"""The lab's experiments: each takes a :class:`Lab` and returns a tidy table.

A tidy table is a list of flat ``dict`` rows (one observation per row), with
floats rounded to 4 decimals so that stored results are small and stable.

==================  ===========================================================
experiment          question
==================  ===========================================================
``training``        training loss against the source's entropy floor
``extrapolation``   loss at ``L, 2L, 4L, 8L, 16L`` for every scheme trained at ``L``
``rope_scaling``    RoPE with PI, NTK, YaRN, Llama 3.1 at test time, before and
                    after a short fine-tune at ``finetune_factor * L``
``early_tokens``    loss by position, ``L``-long windows against one ``4L`` window
``passkey``         retrieval accuracy as the value's distance grows past ``L``
``injection``       sinusoidal and learned tables at the input only or in every layer
==================  ===========================================================

Models are trained once per :class:`Lab` and shared by the experiments; each
model's seed depends only on the configuration and the model's name, so an
experiment gives the same numbers whether it runs alone or after the others.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time

import torch

import posenc

from .._checks import check_choice, check_int
from .model import SCHEMES, TinyDecoder, check_scheme
from .tasks import LanguageTask, RetrievalTask
from .train import evaluate_accuracy, evaluate_loss, peak_memory_mb, seed_for, train

__all__ = [
    "EXPERIMENTS",
    "PRESETS",
    "ROPE_METHODS",
    "TOLERANCE",
    "Lab",
    "LabConfig",
    "compare",
    "curse_summary",
    "rope_scaling_for",
    "run_all",
]

ROPE_METHODS = ("none", "pi", "ntk", "yarn", "llama3")

# Stored and fresh results agree within these (absolute) margins: losses in
# nats, accuracies as fractions.  Same machine and thread count: exactly.
TOLERANCE = {"loss": 0.02, "accuracy": 0.07}


@dataclasses.dataclass(frozen=True)
class LabConfig:
    """Every setting of a lab run (see :data:`PRESETS`)."""

    train_len: int = 32
    eval_factors: tuple[int, ...] = (1, 2, 4, 8, 16)
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    rope_base: float = 100.0
    steps: int = 600
    batch: int = 32
    lr: float = 1e-2
    eval_tokens: int = 4096
    finetune_steps: int = 100
    finetune_factor: int = 4
    curse_factor: int = 4
    curse_sequences: int = 256
    passkey_steps: int = 400
    passkey_factor: int = 8
    passkey_sequences: int = 64
    schemes: tuple[str, ...] = SCHEMES
    passkey_schemes: tuple[str, ...] = ("none", "sinusoidal", "learned", "rope", "alibi", "t5")
    seed: int = 0

    def __post_init__(self):
        for name in (
            "train_len", "d_model", "layers", "heads", "steps", "batch", "eval_tokens",
            "finetune_factor", "curse_factor", "curse_sequences", "passkey_steps", "passkey_factor",
            "passkey_sequences",
        ):  # fmt: skip
            check_int(name, getattr(self, name), minimum=1)
        check_int("finetune_steps", self.finetune_steps, minimum=0)
        check_int("seed", self.seed, minimum=0)
        if self.train_len < 4:
            raise ValueError(f"train_len must be >= 4, got {self.train_len}")
        if not self.eval_factors or any(
            check_int("eval_factors", f, minimum=1) < 1 for f in self.eval_factors
        ):
            raise ValueError(f"eval_factors must be positive integers, got {self.eval_factors}")
        for s in self.schemes + self.passkey_schemes:
            check_scheme(s)

    @property
    def table_len(self) -> int:
        """Rows of every learned table: the longest length any experiment evaluates."""
        return self.train_len * max(max(self.eval_factors), self.passkey_factor, self.curse_factor)

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> LabConfig:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


PRESETS = {
    "full": LabConfig(),
    # what the tests and the chapter re-run: every experiment, every scheme, in seconds
    "smoke": LabConfig(
        train_len=8,
        eval_factors=(1, 2, 4),
        d_model=32,
        steps=40,
        batch=16,
        eval_tokens=256,
        finetune_steps=8,
        finetune_factor=2,
        curse_factor=2,
        curse_sequences=32,
        passkey_steps=40,
        passkey_factor=4,
        passkey_sequences=32,
    ),
}


def rope_scaling_for(method: str, factor: float, train_len: int):
    """The :class:`posenc.RopeScaling` of ``method`` (one of :data:`ROPE_METHODS`) at ``factor``.

    ``None`` (plain RoPE) for ``"none"`` or ``factor == 1``.
    """
    check_choice("method", method, ROPE_METHODS)
    if method == "none" or factor == 1:
        return None
    return {
        "pi": lambda: posenc.RopeScaling.linear(factor),
        "ntk": lambda: posenc.RopeScaling.ntk(factor),
        "yarn": lambda: posenc.RopeScaling.yarn(factor, train_len),
        "llama3": lambda: posenc.RopeScaling.llama3(factor, train_len),
    }[method]()


class Lab:
    """Trains the models an experiment asks for, once, and remembers them."""

    def __init__(self, config: LabConfig | None = None, *, progress: bool = False):
        self.config = PRESETS["full"] if config is None else config
        self.progress = progress
        self.lm = LanguageTask()
        self.retrieval = RetrievalTask()
        self._models: dict = {}

    def model(self, task: str, scheme: str, inject: str = "input"):
        """``(model, curve)``: a :class:`TinyDecoder` trained at ``train_len`` on ``task``."""
        check_choice("task", task, ("lm", "passkey"))
        scheme = check_scheme(scheme)
        key = (task, scheme, inject)
        if key not in self._models:
            c = self.config
            data = self.lm if task == "lm" else self.retrieval
            torch.manual_seed(seed_for(c.seed, "init", *key))
            model = TinyDecoder(
                data.vocab,
                scheme,
                c.train_len,
                d_model=c.d_model,
                layers=c.layers,
                heads=c.heads,
                inject=inject,
                rope_base=c.rope_base,
                table_len=c.table_len if scheme == "learned" else None,
            )
            curve = train(
                model,
                data,
                length=c.train_len,
                steps=c.steps if task == "lm" else c.passkey_steps,
                batch=c.batch,
                lr=c.lr,
                seed=seed_for(c.seed, "data", *key),
                progress=self.progress,
                desc=f"{task} {scheme}" + ("" if inject == "input" else f" ({inject})"),
            )
            self._models[key] = (model, curve)
        return self._models[key]

    def lm_loss(self, model, length: int, name: str = "length") -> torch.Tensor:
        """Per-position loss ``(length,)`` on evaluation data shared by every model."""
        c = self.config
        return evaluate_loss(
            model,
            self.lm,
            length,
            sequences=max(2, c.eval_tokens // length),
            seed=seed_for(c.seed, "eval", length),
            name=name,
        )

    def floor(self, length: int) -> float:
        return self.lm.floor(length).mean().item()


def _r(x: float) -> float:
    return round(float(x), 4)


def _loss_row(lab: Lab, model, f: int, **keys) -> dict:
    """One tidy row: ``keys``, then the mean loss at ``f * L``, the floor there and the excess."""
    n = f * lab.config.train_len
    loss = lab.lm_loss(model, n).mean().item()
    floor = lab.floor(n)
    return {
        **keys,
        "factor": f,
        "length": n,
        "loss": _r(loss),
        "floor": _r(floor),
        "excess": _r(loss - floor),
    }


# ------------------------------------------------------------------ experiments


def training(lab: Lab) -> list[dict]:
    """Training-loss curves of the ``extrapolation`` models, with the floor at ``L``."""
    c = lab.config
    floor = lab.floor(c.train_len)
    rows = []
    for scheme in c.schemes:
        _, curve = lab.model("lm", scheme)
        for i, loss in enumerate(curve):
            step = min((i + 1) * 10, c.steps)
            rows.append({"scheme": scheme, "step": step, "loss": _r(loss), "floor": _r(floor)})
    return rows


def extrapolation(lab: Lab) -> list[dict]:
    """Loss at every evaluation length for every scheme trained at ``L``."""
    c = lab.config
    rows = []
    for scheme in c.schemes:
        model, _ = lab.model("lm", scheme)
        rows += [_loss_row(lab, model, f, scheme=scheme) for f in c.eval_factors]
    return rows


def rope_scaling(lab: Lab) -> list[dict]:
    """RoPE context extension, at test time only and after a short fine-tune."""
    c = lab.config
    base, _ = lab.model("lm", "rope")
    rows = []

    def row(method, finetuned, scale, f):
        rows.append(_loss_row(lab, model, f, method=method, finetuned=finetuned, scale=scale))

    for method in ROPE_METHODS:
        model = copy.deepcopy(base)
        for f in c.eval_factors:  # no fine-tune: the scale follows the length
            model.set_rope_scaling(rope_scaling_for(method, f, c.train_len))
            row(method, False, f if method != "none" else 1, f)
    s = c.finetune_factor
    for method in ROPE_METHODS:
        model = copy.deepcopy(base)
        model.set_rope_scaling(rope_scaling_for(method, s, c.train_len))
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


def early_tokens(lab: Lab) -> list[dict]:
    """Loss by position inside the window: ``L``-long windows against one window ``k L`` long.

    The same ``curse_sequences`` streams of ``k L`` tokens (``k = curse_factor``) are scored
    twice: cut into ``k`` windows of ``L`` (each window sees only itself)
    and whole.  ``position`` is the position inside the window; ``floor``
    is the source's entropy at that position of a fresh sequence.
    """
    c = lab.config
    n = c.curse_factor * c.train_len
    sequences = c.curse_sequences
    floor = lab.lm.floor(n)
    rows = []
    for scheme in ("alibi", "sinusoidal"):
        model, _ = lab.model("lm", scheme)
        gen = torch.Generator().manual_seed(seed_for(c.seed, "curse"))
        inputs, targets, _ = lab.lm.batch(sequences, n, gen)
        with torch.no_grad():
            for window, length in (("short", c.train_len), ("long", n)):
                total = torch.zeros(length, dtype=torch.float64)
                for start in range(0, sequences, 32):  # 32 streams at a time: bounded memory
                    x = inputs[start : start + 32].reshape(-1, length)
                    y = targets[start : start + 32].reshape(-1, length)
                    ce = torch.nn.functional.cross_entropy(
                        model(x).transpose(1, 2), y, reduction="none"
                    )
                    total += ce.to(torch.float64).sum(0)
                per_pos = total / (sequences * n // length)
                for p in range(length):
                    rows.append(
                        {
                            "scheme": scheme,
                            "window": window,
                            "position": p,
                            "loss": _r(per_pos[p]),
                            "floor": _r(floor[p]),
                        }
                    )
    return rows


def curse_summary(rows: list[dict], tail: int = 8) -> list[dict]:
    """How much of the long window's gain the early-token curse alone explains.

    Per scheme: ``short`` and ``long`` are the mean losses of the two
    windowings; ``curse_only`` is the long window's mean loss if every
    position from ``L`` on scored what the last ``tail`` positions of a short
    window score (no use of context beyond ``L``); ``explained`` is
    ``(short - curse_only) / (short - long)``.  The same numbers for the
    entropy floor (``scheme="floor"``) show what an ideal model would gain.
    """
    out = []
    schemes = sorted({r["scheme"] for r in rows})
    for scheme in schemes + ["floor"]:
        src = schemes[0] if scheme == "floor" else scheme
        key = "floor" if scheme == "floor" else "loss"
        short = [r[key] for r in rows if r["scheme"] == src and r["window"] == "short"]
        long_ = [r[key] for r in rows if r["scheme"] == src and r["window"] == "long"]
        L, n = len(short), len(long_)
        s_mean, l_mean = math.fsum(short) / L, math.fsum(long_) / n
        t_mean = math.fsum(short[-tail:]) / tail
        curse_only = (math.fsum(short) + (n - L) * t_mean) / n
        gain = s_mean - l_mean
        out.append(
            {
                "scheme": scheme,
                "short": _r(s_mean),
                "long": _r(l_mean),
                "curse_only": _r(curse_only),
                "gain": _r(gain),
                "explained": _r((s_mean - curse_only) / gain) if gain > 0 else None,
            }
        )
    return out


def passkey(lab: Lab) -> list[dict]:
    """Retrieval accuracy by distance band, at ``L`` and at ``passkey_factor * L``."""
    c = lab.config
    L, n = c.train_len, c.passkey_factor * c.train_len
    bands = [(1, L - 1)]
    lo = L
    while lo <= n - 1:
        bands.append((lo, min(2 * lo - 1, n - 1)))
        lo *= 2
    rows = []
    for scheme in c.passkey_schemes:
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
                    "accuracy": _r(acc),
                }
            )
    return rows


def injection(lab: Lab) -> list[dict]:
    """Sinusoidal and learned tables added at the input only or to every layer's input."""
    c = lab.config
    rows = []
    for scheme in ("sinusoidal", "learned"):
        for inject in ("input", "every"):
            model, curve = lab.model("lm", scheme, inject)
            for f in sorted({1, 2} & set(c.eval_factors)) or [1]:
                row = _loss_row(lab, model, f, scheme=scheme, inject=inject)
                rows.append({**row, "final_train_loss": _r(curve[-1])})
    return rows


EXPERIMENTS = {
    "training": training,
    "extrapolation": extrapolation,
    "rope_scaling": rope_scaling,
    "early_tokens": early_tokens,
    "passkey": passkey,
    "injection": injection,
}


def run_all(
    config: LabConfig | None = None,
    experiments=None,
    *,
    progress: bool = False,
    log=None,
) -> dict:
    """Run ``experiments`` (names from :data:`EXPERIMENTS`; all by default).

    Returns ``{"config": ..., "results": {name: rows}, "meta": {...}}``;
    ``meta`` holds wall-clock seconds and peak memory per experiment (they
    vary from run to run and are never compared).  ``log`` (e.g. ``print``)
    receives one line per finished experiment.
    """
    lab = Lab(config, progress=progress)
    names = list(EXPERIMENTS) if experiments is None else list(experiments)
    for name in names:
        check_choice("experiments", name, EXPERIMENTS)
    results, meta = {}, {"seconds": {}, "peak_memory_mb": {}, "torch": torch.__version__}
    for name in names:
        start = time.perf_counter()
        results[name] = EXPERIMENTS[name](lab)
        meta["seconds"][name] = round(time.perf_counter() - start, 1)
        meta["peak_memory_mb"][name] = round(peak_memory_mb(), 1)
        if log is not None:
            log(
                f"{name}: {meta['seconds'][name]:.1f} s, "
                f"peak memory {meta['peak_memory_mb'][name]:.0f} MiB"
            )
    return {"config": lab.config.to_dict(), "results": results, "meta": meta}


def compare(stored: dict, fresh: dict, tolerance: dict | None = None) -> list[str]:
    """Differences between two :func:`run_all` outputs beyond ``tolerance`` (empty: agree).

    Compares every experiment present in ``fresh``: same rows, same keys,
    equal non-float fields, floats within ``tolerance["loss"]`` (or
    ``["accuracy"]`` for accuracies).  Schemes registered after ``stored`` was
    made (in ``fresh``'s config, not in ``stored``'s) are left out of the
    comparison, so that registering a scheme does not invalidate the stored
    results of the others; every other setting must be equal.
    """
    tol = dict(TOLERANCE, **(tolerance or {}))
    problems = []
    lists = ("schemes", "passkey_schemes")
    old_config, new_config = dict(stored["config"]), dict(fresh["config"])
    known = {s for key in lists for s in old_config.get(key, ())}
    for key in lists:
        kept = [s for s in new_config.get(key, ()) if s in known]
        if kept != list(old_config.get(key, ())):
            problems.append(f"configs differ ({key})")
            return problems
        old_config.pop(key, None), new_config.pop(key, None)
    if old_config != new_config:
        problems.append("configs differ")
        return problems
    for name, rows in fresh["results"].items():
        rows = [r for r in rows if r.get("scheme", "floor") in known | {"floor"}]
        old = stored["results"].get(name)
        if old is None or len(old) != len(rows):
            problems.append(f"{name}: row count {None if old is None else len(old)} != {len(rows)}")
            continue
        for i, (a, b) in enumerate(zip(old, rows, strict=True)):
            if a.keys() != b.keys():
                problems.append(f"{name}[{i}]: keys differ")
                continue
            for k in a:
                x, y = a[k], b[k]
                if isinstance(x, float) and isinstance(y, float):
                    t = tol["accuracy"] if k == "accuracy" else tol["loss"]
                    if abs(x - y) > t:
                        problems.append(f"{name}[{i}].{k}: stored {x} vs fresh {y}")
                elif x != y:
                    problems.append(f"{name}[{i}].{k}: stored {x!r} vs fresh {y!r}")
    return problems
