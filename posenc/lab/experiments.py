"""The lab's experiments: each takes a :class:`Lab` and returns a tidy table.

Every experiment that applies to any scheme runs the schemes of the
configuration (``LabConfig.schemes``, by default every name in
:data:`posenc.SCHEMES`); ``rope_scaling`` (RoPE only) and ``injection``
(schemes that act on the input) keep their own selection, said in their docstrings.

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
``injection``       input tables (sinusoidal, learned) at the input only or in every layer
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
from .stats import t_interval
from .tasks import LanguageTask, RetrievalTask
from .train import evaluate_accuracy, evaluate_loss, peak_memory_mb, seed_for, train

__all__ = [
    "DESCRIPTIONS",
    "EXPERIMENTS",
    "PRESETS",
    "ROPE_METHODS",
    "TOLERANCE",
    "Lab",
    "LabConfig",
    "compare",
    "curse_batches",
    "curse_summary",
    "parse_seeds",
    "rope_scaling_for",
    "run_all",
    "summarize",
]

ROPE_METHODS = ("none", "pi", "ntk", "yarn", "llama3")


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
    # ``None``: the same schemes as ``schemes`` (the retrieval task applies to every
    # scheme); a list equal to ``schemes`` is stored as ``None``, so that
    # ``dataclasses.replace(config, schemes=...)`` changes both
    passkey_schemes: tuple[str, ...] | None = None
    seed: int = 0

    def __post_init__(self):
        if self.passkey_schemes is not None and tuple(self.passkey_schemes) == tuple(self.schemes):
            object.__setattr__(self, "passkey_schemes", None)  # frozen: canonical form, once
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
        for s in self.schemes + self.retrieval_schemes:
            check_scheme(s)

    @property
    def retrieval_schemes(self) -> tuple[str, ...]:
        """The schemes ``passkey`` trains: ``passkey_schemes``, or ``schemes`` when ``None``."""
        return self.schemes if self.passkey_schemes is None else tuple(self.passkey_schemes)

    @property
    def table_len(self) -> int:
        """Rows of every learned table: the longest length any experiment evaluates."""
        return self.train_len * max(max(self.eval_factors), self.passkey_factor, self.curse_factor)

    def to_dict(self) -> dict:
        """Every field, tuples as lists; ``passkey_schemes`` written out in full."""
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}
        return dict(d, passkey_schemes=list(self.retrieval_schemes))

    @classmethod
    def from_dict(cls, d: dict) -> LabConfig:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


PRESETS = {
    # The stored 5-seed run, sized to the shared 2-core machine (see the README): 300
    # steps; 32 evaluation sequences at 16L (max(32, eval_tokens // length) at every
    # length), 128 per passkey band.  Schemes: the six the propositions are about, then
    # xpos and kerple.  One scheme x one seed (its language and retrieval models and
    # their evaluations) took, at one thread on the shared 2-core machine: xpos 35 s,
    # kerple 32, fire 34, cope 51, shaw 33, transformer_xl 31, da 21; so all 13
    # registered schemes x 5 seeds with --jobs 2 would take about 25 min, more than
    # the time the stored run had.  The stored run of these eight took 1001 s of wall
    # clock with --jobs 2 (meta in results/full.json).  The other registered schemes
    # run with ``dataclasses.replace(PRESETS["full"], schemes=tuple(posenc.SCHEMES))``.
    "full": LabConfig(
        steps=300,
        passkey_steps=300,
        eval_tokens=8192,
        passkey_sequences=128,
        schemes=("none", "sinusoidal", "learned", "rope", "alibi", "t5", "xpos", "kerple"),
    ),
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

    def __init__(self, config: LabConfig | None = None, *, progress: bool = False, device="cpu"):
        self.config = PRESETS["full"] if config is None else config
        self.progress = progress
        self.device = torch.device(device)  # data is drawn on the CPU, models run here
        self.lm = LanguageTask()
        self.retrieval = RetrievalTask()
        self._tasks = {"lm": self.lm, "passkey": self.retrieval}
        self._models: dict = {}

    def model(self, task: str, scheme: str, inject: str = "input", **variant):
        """``(model, curve)``: a :class:`TinyDecoder` trained at ``train_len`` on ``task``.

        ``variant``: :class:`TinyDecoder` settings that differ from the
        configuration's, for the sweeps (``rope_base``, ``heads``,
        ``alibi_slope_scale``).  A variant is a model of its own, with its own
        seed; with no variant the seeds are those of the stored runs.
        """
        check_choice("task", task, tuple(self._tasks))
        scheme = check_scheme(scheme)
        for name in variant:
            check_choice("variant", name, ("rope_base", "heads", "alibi_slope_scale"))
        key = (task, scheme, inject) + tuple(sorted(variant.items()))
        if key not in self._models:
            c = self.config
            data = self._tasks[task]
            torch.manual_seed(seed_for(c.seed, "init", *key))
            settings = dict(
                d_model=c.d_model,
                layers=c.layers,
                heads=c.heads,
                inject=inject,
                rope_base=c.rope_base,
                table_len=c.table_len if scheme == "learned" else None,
            )
            model = TinyDecoder(
                data.vocab, scheme, c.train_len, **{**settings, **variant}
            ).to(self.device)
            steps = {"lm": c.steps, "passkey": c.passkey_steps}.get(task)
            curve = train(
                model,
                data,
                length=c.train_len,
                steps=c.steps if steps is None else steps,
                batch=c.batch,
                lr=c.lr,
                seed=seed_for(c.seed, "data", *key),
                progress=self.progress,
                desc=f"{task} {scheme}"
                + ("" if inject == "input" else f" ({inject})")
                + "".join(f" {k}={v}" for k, v in sorted(variant.items())),
            )
            self._models[key] = (model, curve)
        return self._models[key]

    def lm_loss(self, model, length: int, name: str = "length", per_sequence: bool = False):
        """Per-position loss ``(length,)`` on evaluation data shared by every model.

        ``max(32, eval_tokens // length)`` fresh sequences; with
        ``per_sequence=True`` also each sequence's mean loss (see :func:`evaluate_loss`).
        """
        c = self.config
        return evaluate_loss(
            model,
            self.lm,
            length,
            sequences=max(32, c.eval_tokens // length),
            seed=seed_for(c.seed, "eval", length),
            name=name,
            per_sequence=per_sequence,
        )

    def floor(self, length: int) -> float:
        return self.lm.floor(length).mean().item()


def _r(x: float) -> float:
    return round(float(x), 4)


def _loss_row(lab: Lab, model, f: int, **keys) -> dict:
    """One tidy row: ``keys``, then the mean loss at ``f * L``, the floor there and the excess.

    ``eval_se`` is the standard error of ``loss`` over the evaluation
    sequences (the evaluation noise of this one trained model).
    """
    n = f * lab.config.train_len
    per_pos, each = lab.lm_loss(model, n, per_sequence=True)
    loss = per_pos.mean().item()
    floor = lab.floor(n)
    return {
        **keys,
        "factor": f,
        "length": n,
        "loss": _r(loss),
        "floor": _r(floor),
        "excess": _r(loss - floor),
        "eval_se": _r(each.std().item() / math.sqrt(len(each))),
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
    """RoPE context extension, at test time only and after a short fine-tune.

    Specific to ``rope``: the scalings (:data:`ROPE_METHODS`) change RoPE's
    frequencies, so this experiment trains the ``rope`` model whatever
    ``config.schemes`` holds.
    """
    c = lab.config
    base, _ = lab.model("lm", "rope")
    rows = []

    def row(method, finetuned, scale, f):
        rows.append(_loss_row(lab, model, f, method=method, finetuned=finetuned, scale=scale))

    for method in ROPE_METHODS:
        model = copy.deepcopy(base)
        for f in c.eval_factors:  # no fine-tune: the scale follows the length
            model.set_rope_scaling(rope_scaling_for(method, f, c.train_len))
            model.to(lab.device)
            row(method, False, f if method != "none" else 1, f)
    s = c.finetune_factor
    for method in ROPE_METHODS:
        model = copy.deepcopy(base)
        model.set_rope_scaling(rope_scaling_for(method, s, c.train_len))
        model.to(lab.device)
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


def curse_batches(lab: Lab, scheme: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs ``early_tokens`` scores: ``(short, long)`` windows, each a fresh sample.

    ``long`` is ``(curse_sequences, k L)``; ``short`` is ``(k * curse_sequences, L)``,
    so both hold the same number of tokens.  Every window is a fresh sequence
    of its own length, never a piece cut from a longer stream: the source is
    not stationary (its first ``max(offsets)`` tokens are never copies), so a
    window cut at a multiple of ``L`` would start with the law of a mid-stream
    token, and its loss could sit below the entropy floor drawn for it.
    """
    c = lab.config
    k, n = c.curse_factor, c.curse_factor * c.train_len
    gen = torch.Generator().manual_seed(seed_for(c.seed, "curse"))
    long_ = lab.lm.source.sample(c.curse_sequences, n + 1, gen)
    short = lab.lm.source.sample(k * c.curse_sequences, c.train_len + 1, gen)
    return short, long_


def early_tokens(lab: Lab) -> list[dict]:
    """Loss by position inside the window: ``L``-long windows against windows ``k L`` long.

    The same number of tokens (``curse_sequences`` windows of ``k L``,
    ``k = curse_factor``, or ``k`` times as many windows of ``L``; see
    :func:`curse_batches`) is scored both ways.  ``position`` is the position
    inside the window; ``floor`` is the source's entropy there, which is
    the law of both kinds of window.  Every scheme of ``config.schemes`` is scored.
    """
    c = lab.config
    n = c.curse_factor * c.train_len
    floor = lab.lm.floor(n)
    rows = []
    short, long_ = curse_batches(lab)
    for scheme in c.schemes:
        model, _ = lab.model("lm", scheme)
        with torch.no_grad():
            for window, tokens in (("short", short), ("long", long_)):
                length = tokens.shape[1] - 1
                total = torch.zeros(length, dtype=torch.float64)
                for start in range(0, len(tokens), 32):  # 32 windows at a time: bounded memory
                    chunk = tokens[start : start + 32].to(lab.device)
                    x, y = chunk[:, :-1], chunk[:, 1:]
                    ce = torch.nn.functional.cross_entropy(
                        model(x).transpose(1, 2), y, reduction="none"
                    )
                    total += ce.to("cpu", torch.float64).sum(0)
                per_pos = total / len(tokens)
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

    Per seed (when rows carry one) and scheme: ``short`` and ``long`` are the
    mean losses of the two windowings; ``curse_only`` is the long window's
    mean loss if every position from ``L`` on scored what the last ``tail``
    positions of a short window score (no use of context beyond ``L``);
    ``gain = short - long``; ``explained`` is
    ``rho = (short - curse_only) / gain``.  The same numbers for the entropy
    floor (``scheme="floor"``) show what an ideal model would gain.
    """
    out = []
    for seed in dict.fromkeys(r.get("seed") for r in rows):
        mine = [r for r in rows if r.get("seed") == seed]
        schemes = sorted({r["scheme"] for r in mine})
        for scheme in schemes + ["floor"]:
            src = schemes[0] if scheme == "floor" else scheme
            key = "floor" if scheme == "floor" else "loss"
            short = [r[key] for r in mine if r["scheme"] == src and r["window"] == "short"]
            long_ = [r[key] for r in mine if r["scheme"] == src and r["window"] == "long"]
            L, n = len(short), len(long_)
            s_mean, l_mean = math.fsum(short) / L, math.fsum(long_) / n
            t_mean = math.fsum(short[-tail:]) / tail
            curse_only = (math.fsum(short) + (n - L) * t_mean) / n
            gain = s_mean - l_mean
            row = {} if seed is None else {"seed": seed}
            out.append(
                {
                    **row,
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
    """Retrieval accuracy by distance band, at ``L`` and at ``passkey_factor * L``.

    Every scheme of ``config.retrieval_schemes`` (``passkey_schemes``, by default
    the same as ``schemes``) is trained on the retrieval task; when ``rope`` is
    among them, the RoPE model is also evaluated with each scaling of
    :data:`ROPE_METHODS` at factor ``passkey_factor`` (rows ``rope:<method>``).
    """
    c = lab.config
    L, n = c.train_len, c.passkey_factor * c.train_len
    bands = [(1, L - 1)]
    lo = L
    while lo <= n - 1:
        bands.append((lo, min(2 * lo - 1, n - 1)))
        lo *= 2
    rows = []
    for scheme in c.retrieval_schemes:
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
    if "rope" in c.retrieval_schemes:  # the RoPE model with each scaling at factor n / L
        for method in ROPE_METHODS[1:]:
            model = copy.deepcopy(lab.model("passkey", "rope")[0])
            model.set_rope_scaling(rope_scaling_for(method, c.passkey_factor, L))
            model.to(lab.device)
            for band in bands:
                acc = evaluate_accuracy(
                    model,
                    lab.retrieval,
                    n,
                    band,
                    sequences=c.passkey_sequences,
                    seed=seed_for(c.seed, "passkey-eval", n, band),
                )
                rows.append(
                    {"scheme": f"rope:{method}", "length": n, "lo": band[0], "hi": band[1],
                     "accuracy": _r(acc)}
                )  # fmt: skip
    return rows


def injection(lab: Lab) -> list[dict]:
    """Input tables added at the input only or to every layer's input.

    Specific to the schemes that act on the input (``acts_on == "input"`` in
    :data:`posenc.SCHEMES`: ``sinusoidal`` and ``learned``): only they can be
    injected in two ways.  Every such scheme of ``config.schemes`` is run.
    """
    c = lab.config
    rows = []
    for scheme in [s for s in c.schemes if posenc.SCHEMES[s].acts_on == "input"]:
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

#: One line per experiment (``python -m posenc.lab --help`` lists them).
DESCRIPTIONS = {
    "training": "training-loss curves of every scheme at L, against the entropy floor",
    "extrapolation": "loss above the floor at L, 2L, 4L, 8L, 16L for every scheme trained at L",
    "rope_scaling": "RoPE with PI, NTK, YaRN, Llama 3.1 at test time, and after a short "
    "fine-tune (plain RoPE fine-tuned: the control)",
    "early_tokens": "loss by position in fresh L-long windows against fresh 4L-long ones, "
    "every scheme",
    "passkey": "retrieval accuracy by distance band at L and 8L (RoPE also with its scalings)",
    "injection": "input tables (sinusoidal, learned) at the input only or in every layer",
}


def parse_seeds(text) -> list[int]:
    """Seeds from ``"0-4"``, ``"0,2,5"``, ``"3"`` or a list; ``ValueError`` naming ``seeds``."""
    if isinstance(text, (list, tuple, range)):
        seeds = [check_int("seeds", s, minimum=0) for s in text]
    else:
        seeds = []
        for part in str(text).split(","):
            lo, sep, hi = part.strip().partition("-")
            try:
                lo, hi = int(lo), int(hi) if sep else int(lo)
            except ValueError:
                raise ValueError(
                    f"seeds must be non-negative integers or ranges like '0-4', got {text!r}"
                ) from None
            if lo < 0 or hi < lo:
                raise ValueError(
                    f"seeds must be ranges lo-hi with 0 <= lo <= hi (like '0-4'), got {part!r}"
                )
            seeds += range(lo, hi + 1)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {text!r}")
    return seeds


def _run_seed(config: LabConfig, names, progress=False, log=None, threads=None, device="cpu"):
    """All ``names`` for one seed: ``(results, meta)``; every row starts with ``seed``."""
    if threads is not None:
        torch.set_num_threads(threads)
    lab = Lab(config, progress=progress, device=device)
    results, meta = {}, {"seconds": {}, "peak_memory_mb": {}}
    for name in names:
        start = time.perf_counter()
        results[name] = [{"seed": config.seed, **r} for r in EXPERIMENTS[name](lab)]
        meta["seconds"][name] = round(time.perf_counter() - start, 1)
        meta["peak_memory_mb"][name] = round(peak_memory_mb(), 1)
        if log is not None:
            log(
                f"seed {config.seed} {name}: {meta['seconds'][name]:.1f} s, "
                f"peak memory {meta['peak_memory_mb'][name]:.0f} MiB"
            )
    return results, meta


def _run_seed_job(config_dict, names, threads, device):  # top level: picklable for workers
    return _run_seed(LabConfig.from_dict(config_dict), names, threads=threads, device=device)


def run_all(
    config: LabConfig | None = None,
    experiments=None,
    *,
    seeds=None,
    jobs: int = 1,
    device="cpu",
    progress: bool = False,
    log=None,
) -> dict:
    """Run ``experiments`` (names from :data:`EXPERIMENTS`; all by default) for every seed.

    ``device``: where the models run (``"cpu"``, or ``"cuda"`` where CUDA is
    present); the data is drawn on the CPU, so a seed sees the same data anywhere.

    ``seeds``: a list of ints or a string like ``"0-4"`` (default: the
    config's ``seed``).  ``jobs > 1`` runs seeds in that many worker processes,
    each with ``max(1, torch.get_num_threads() // jobs)`` threads; a seed's
    numbers do not depend on the process that ran it.

    Returns ``{"config": ..., "seeds": [...], "results": {name: rows}, "meta": {...}}``:
    one row per seed and observation (``row["seed"]``), seeds in order.
    ``meta`` holds wall-clock seconds and peak memory per seed and experiment
    (they vary from run to run and are never compared).  ``log`` (e.g.
    ``print``) receives one line per finished experiment.
    """
    config = PRESETS["full"] if config is None else config
    names = list(EXPERIMENTS) if experiments is None else list(experiments)
    for name in names:
        check_choice("experiments", name, EXPERIMENTS)
    seeds = [config.seed] if seeds is None else parse_seeds(seeds)
    jobs = check_int("jobs", jobs, minimum=1)
    configs = [dataclasses.replace(config, seed=s) for s in seeds]
    if jobs == 1 or len(seeds) == 1:
        outs = [_run_seed(c, names, progress, log, device=device) for c in configs]
    else:
        import concurrent.futures as cf
        import multiprocessing as mp

        threads = max(1, torch.get_num_threads() // jobs)
        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = [
                pool.submit(_run_seed_job, c.to_dict(), names, threads, str(device))
                for c in configs
            ]
            outs = []
            for c, f in zip(configs, futures, strict=True):
                outs.append(f.result())
                if log is not None:
                    log(f"seed {c.seed}: {sum(outs[-1][1]['seconds'].values()):.1f} s")
    results = {name: [r for res, _ in outs for r in res[name]] for name in names}
    meta = {
        "seconds": {str(c.seed): m["seconds"] for c, (_, m) in zip(configs, outs, strict=True)},
        "peak_memory_mb": max(max(m["peak_memory_mb"].values(), default=0) for _, m in outs),
        "jobs": jobs,
        "torch": torch.__version__,
    }
    return {"config": configs[0].to_dict(), "seeds": seeds, "results": results, "meta": meta}


def _group_key(row: dict) -> tuple:
    """The fields that name an observation: every non-float field except ``seed``."""
    return tuple(
        (k, v) for k, v in row.items() if k != "seed" and v is not None and not isinstance(v, float)
    )


def summarize(rows: list[dict]) -> list[dict]:
    """Rows averaged over seeds: each float field ``x`` becomes ``x`` (mean),
    ``x_lo`` and ``x_hi`` (a 95% t-interval over the seeds where it is defined, not
    ``None``; equal to the mean for one seed), plus ``seeds`` (how many rows)."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(_group_key(r), []).append(r)
    out = []
    for key, rs in groups.items():
        row = dict(key)
        fields = dict.fromkeys(k for r in rs for k, v in r.items() if isinstance(v, float))
        for k in fields:
            vals = [r[k] for r in rs if isinstance(r.get(k), float)]  # None: undefined there
            mean, lo, hi = t_interval(vals)
            row[k], row[f"{k}_lo"], row[f"{k}_hi"] = mean, lo, hi
        row["seeds"] = len(rs)
        out.append(row)
    return out


#: Compared summaries: a fresh mean passes when it lies within ``spread`` times the
#: seed standard deviation of the difference of means, ``sd * sqrt(1/n_stored + 1/n_fresh)``,
#: plus an absolute margin (the evaluation resolution): losses in nats, accuracies as fractions.
TOLERANCE = {"spread": 6.0, "loss": 0.01, "accuracy": 0.05}


def _compared(results: dict) -> dict:
    """The summary statistics ``compare`` looks at: ``{(experiment, key, field): [per-seed]}``."""
    out: dict = {}

    def add(name, rows, fields):
        for r in rows:
            for k in fields:
                if isinstance(r.get(k), float):
                    out.setdefault((name, _group_key(r), k), []).append(r[k])

    for name, rows in results.items():
        if name == "training":  # the end of each curve, not every step
            last = max(r["step"] for r in rows)
            add(name, [r for r in rows if r["step"] == last], ("loss",))
        elif name == "early_tokens":
            add(name, curse_summary(rows), ("short", "long", "curse_only", "gain"))
        else:
            add(name, rows, ("loss", "excess", "accuracy", "final_train_loss", "floor"))
    return out


def compare(stored: dict, fresh: dict, tolerance: dict | None = None) -> list[str]:
    """Statistical differences between two :func:`run_all` outputs (empty list: they agree).

    For every summary statistic (loss, excess and accuracy rows; the last
    training loss; the early-token summary), the mean over ``fresh``'s seeds
    must lie within ``tolerance["spread"]`` standard errors of the difference
    of means (the standard deviation over ``stored``'s seeds, or over
    ``fresh``'s when ``stored`` has one seed) plus an absolute margin
    (``tolerance["loss"]`` nats or ``["accuracy"]``): see :data:`TOLERANCE`.
    So another CPU, thread count or set of seeds passes unless the
    difference is far outside the seed-to-seed spread.  The entropy floor,
    which is exact, must agree to 1e-4.  Schemes that ``fresh`` runs and
    ``stored`` did not (registered after it was made, or left out of its
    run) are left out, per experiment; every other setting must be equal
    (``seed`` aside).
    """
    tol = dict(TOLERANCE, **(tolerance or {}))
    problems = []
    lists = ("schemes", "passkey_schemes")
    old_config, new_config = dict(stored["config"]), dict(fresh["config"])
    for key in lists:
        old_list = old_config.get(key) or old_config.get("schemes", ())  # None: as schemes
        kept = [s for s in new_config.get(key) or new_config.get("schemes", ()) if s in old_list]
        if kept != list(old_list):
            problems.append(f"configs differ ({key})")
            return problems
    for key in lists:
        old_config.pop(key, None), new_config.pop(key, None)
    old_config.pop("seed", None), new_config.pop("seed", None)
    if old_config != new_config:
        problems.append("configs differ")
        return problems

    def stored_schemes(name):  # the schemes (and scalings, floor) stored for one experiment
        return {r.get("scheme", "floor") for r in stored["results"].get(name, [])} | {"floor"}

    fresh_results = {
        name: [r for r in rows if r.get("scheme", "floor") in stored_schemes(name)]
        for name, rows in fresh["results"].items()
    }
    old = _compared({n: stored["results"].get(n, []) for n in fresh_results})
    new = _compared(fresh_results)
    for key in sorted(set(old) | set(new), key=repr):
        name, group, field = key
        where = f"{name}[{', '.join(f'{k}={v}' for k, v in group)}].{field}"
        if key not in old or key not in new:
            problems.append(f"{where}: only in {'fresh' if key in new else 'stored'}")
            continue
        a, b = old[key], new[key]
        ma, mb = math.fsum(a) / len(a), math.fsum(b) / len(b)
        if field == "floor":
            if abs(ma - mb) > 1e-4:
                problems.append(f"{where}: stored {ma:.4f} vs fresh {mb:.4f} (exact)")
            continue
        sd = _sd(a) if len(a) > 1 else _sd(b)
        margin = tol["accuracy"] if field == "accuracy" else tol["loss"]
        bound = tol["spread"] * sd * math.sqrt(1 / len(a) + 1 / len(b)) + margin
        if abs(ma - mb) > bound:
            problems.append(
                f"{where}: stored mean {ma:.4f} ({len(a)} seeds) vs fresh {mb:.4f} "
                f"({len(b)} seeds), allowed {bound:.4f}"
            )
    return problems


def _sd(values) -> float:
    if len(values) < 2:
        return 0.0
    m = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1))
