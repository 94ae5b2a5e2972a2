"""A lab run's settings (:class:`LabConfig`, :data:`PRESETS`) and its trained models (:class:`Lab`).

Models are trained once per :class:`Lab` and shared by the experiments; each
model's seed depends only on the configuration and the model's name, so an
experiment gives the same numbers whether it runs alone or after the others.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Literal, TypeAlias, overload

import torch

import posenc

from .._checks import check_choice, check_float, check_int
from .fflm import FlipFlopTask, read_errors
from .model import SCHEMES, TinyDecoder, check_scheme
from .patterns import LAYER_PATTERNS, layer_pattern
from .scoring import round_accuracies, rounded
from .tasks import LanguageTask, LeadRecallTask, RecallTask, RetrievalTask
from .train import evaluate_loss, seed_for, train

__all__ = [
    "FFLM_SCHEMES", "PRESETS", "ROPE_METHODS", "Lab", "LabConfig", "loss_row", "rope_scaling_for",
    "rounded",
]  # fmt: skip

#: The ways of stretching RoPE that the experiments compare, as :func:`rope_scaling_for` names
#: them: ``"none"`` (plain RoPE), ``"pi"`` (position interpolation,
#: :meth:`posenc.RopeScaling.linear`), ``"ntk"``, ``"yarn"`` and ``"llama3"``.
ROPE_METHODS = ("none", "pi", "ntk", "yarn", "llama3")

#: One row of an experiment's table: JSON-ready fields (str, int, float, bool, None, lists).
Row: TypeAlias = dict[str, Any]
# A trained model's key in Lab: (task, scheme, inject, *sorted (setting, value) pairs).
_ModelKey: TypeAlias = tuple[Hashable, ...]


@dataclasses.dataclass(frozen=True)
class LabConfig:
    """Every setting of a lab run (see :data:`PRESETS`).

    Frozen; :meth:`to_dict` and :meth:`from_dict` give the JSON form stored in a
    results file.  Invalid settings raise ``ValueError`` naming the field.

    Parameters
    ----------
    train_len
        ``L``: the length every model is trained at (``>= 4``).
    eval_factors
        The evaluation lengths ``f L`` of the language models (extrapolation, the
        sweeps, the loss by position and the sliding windows).
    d_model, layers, heads
        Width, depth and number of heads of every :class:`TinyDecoder`.
    layer_pattern
        ``None`` (every layer the model's scheme), or a name of
        :data:`~posenc.lab.LAYER_PATTERNS`: every model the run trains gets that
        per-layer pattern (:func:`~posenc.lab.layer_pattern` at its depth, training
        length and ``rope_base``), on the seeds of the same scheme without it.  Every
        scheme of the run must then act on attention, one instance per layer.
        :meth:`to_dict` leaves it out when ``None``.
    rope_base
        RoPE's base in the lab's models (100: every pair turns within ``L`` tokens).
    steps, batch, lr
        Training steps of each language model, sequences per step, and the peak
        learning rate (AdamW with warmup and a cosine schedule, :func:`train`).
    eval_tokens
        Evaluation tokens per length: ``max(32, eval_tokens // length)`` fresh
        sequences, the same for every model.
    finetune_steps, finetune_factor
        ``rope_scaling``'s short fine-tune: ``finetune_steps`` steps at
        ``finetune_factor * L`` (batch ``batch // finetune_factor``, learning rate
        ``lr / 5``).
    curse_factor, curse_sequences
        ``early_tokens``: ``curse_sequences`` windows of ``curse_factor * L`` tokens
        against ``curse_factor`` times as many windows of ``L``.
    passkey_steps, passkey_factor, passkey_sequences
        The retrieval models: training steps, the longest context
        ``passkey_factor * L``, and sequences per distance band.
    schemes
        The schemes trained on language modelling (names of ``posenc.SCHEMES``).
    passkey_schemes
        The schemes the retrieval task trains; ``None`` (and a tuple equal to
        ``schemes``, stored as ``None``): the same as ``schemes``
        (:attr:`retrieval_schemes`).
    rope_bases, alibi_slope_scales, yarn_betas, wide_heads
        The sweeps (:mod:`posenc.lab.sweeps`): RoPE models at each base (the first
        is the ``extrapolation`` model's), ALiBi models with every slope multiplied
        by each scale, YaRN's ``beta_fast`` at test time, and the number of heads
        of the wide-head RoPE model.
    sliding_stride
        Sliding-window evaluation (:mod:`posenc.lab.curves`): windows advance by
        this fraction of their length, in (0, 1].
    lm_long_steps
        ``rope_budget``: RoPE trained this many steps, with the initialisation,
        data and warmup of the ``steps`` model.
    lm_budget_schemes, lm_lr_scales
        ``lm_budget``: these schemes' language models also trained ``lm_long_steps``
        steps, and ``steps`` steps at ``lr`` times each scale, with the
        initialisation, data and warmup of the ``steps`` model.  Empty (default):
        no such models, as every stored run; :meth:`to_dict` leaves them out then.
    recall_steps, recall_warmup, recall_pairs
        Multi-query recall (:mod:`posenc.lab.recall`): training steps, warmup steps
        (``None``: ``recall_steps // 20``) and key-value pairs per sequence.
    recall_factors, recall_sequences, recall_band_answers
        Recall contexts ``c L``; inputs of the in-view score; answers per distance
        band and context.
    recall_probe_every, recall_probe_sequences
        The in-view accuracy is probed during training every
        ``recall_probe_every`` steps on ``recall_probe_sequences`` fixed inputs.
    recall_schemes
        The schemes the recall task trains; ``()``: the same as ``schemes``.
    recall_control_schemes, recall_control_lead
        The trained window-of-``L`` control: each scheme of
        ``recall_control_schemes`` that the run trains on recall (a run in parts,
        ``--schemes``, keeps the list and trains the controls of its own schemes) also
        trains a recall model whose attention sees only its last ``L`` keys, from the same
        initialisation and on the same recall inputs as its full model, each
        step's batch moved by ``n`` filler tokens, ``n`` drawn uniformly from
        ``0 .. recall_control_lead * L`` (``posenc.lab.tasks.LeadRecallTask``),
        so that the window binds during training and the model meets the
        positions beyond ``L``.  ``recall()`` scores it beside the full model
        (``attention = "trained-window"``).  Empty (default): no such model, as
        every stored run; :meth:`to_dict` leaves both out then.
    recall_lead
        the experiment ``recall_lead``: the bands beyond
        ``L`` at the largest recall context scored again with ``recall_lead * L``
        filler tokens before the same inputs, so that the far keys sit away from
        the input's start.  ``0`` (default): not scored, as every stored run;
        :meth:`to_dict` leaves it out then.
    needle_depths
        Where the needle grid places its pair, as fractions of the context in [0, 1].
    needle_scalings
        Also score RoPE's needle grid with each scaling of ``ROPE_METHODS`` at every
        context beyond ``L`` (rows ``rope:<method>``, as ``recall()`` scores its
        bands).  ``False`` (default): the plain models only, as every stored run.
        :meth:`to_dict` leaves it out when ``False``.
    fflm_train_len, fflm_p_ignore
        Flip-flop language modelling (:mod:`posenc.lab.flipflop`): every FFLM model is
        trained on FFL(``fflm_p_ignore``) sequences of ``fflm_train_len`` tokens (even;
        the model reads the first ``fflm_train_len - 1`` and predicts the next).
    fflm_steps, fflm_batch, fflm_lr, fflm_warmup
        Its training: steps, sequences per step, peak learning rate and warmup steps
        (:func:`train`: AdamW without weight decay, gradients clipped to norm 1, a
        linear warmup, then a cosine to 0).
    fflm_eval_p, fflm_eval_lengths, fflm_eval_reads
        Its evaluation: FFL(``p``) for each ``p`` of ``fflm_eval_p`` at each length of
        ``fflm_eval_lengths`` (tokens, even), enough fresh sequences for about
        ``fflm_eval_reads`` scored reads each.
    fflm_probe_every, fflm_probe_sequences
        The in-distribution read error and loss, probed during training every
        ``fflm_probe_every`` steps on ``fflm_probe_sequences`` fixed sequences.

        The FFLM fields' defaults are a smoke size (seconds; what the ``smoke``
        preset runs); the ``fflm`` and ``fflm-length`` presets set their own.
        :meth:`to_dict` leaves out an FFLM field at its default, so the configs
        stored before these fields existed read and compare as they did.
    compile_step
        Train the models :meth:`Lab.model` makes with the compiled step
        (:func:`train` with ``compiled=True``: forward pass and loss compiled by
        ``torch.compile``, fused AdamW): the same training in exact arithmetic,
        rounded differently, so the same results in distribution (tested against
        the eager step over seeds).  ``False`` (default): the eager step, which
        made every stored result.  :meth:`to_dict` leaves it out when ``False``,
        so the stored configs read and compare as they did.
    seed
        The run's seed (``>= 0``): every model's and every batch's seed derives
        from it (:func:`seed_for`).
    """

    train_len: int = 32
    eval_factors: tuple[int, ...] = (1, 2, 4, 8, 16)
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    # a per-layer pattern (posenc.lab.patterns) for every model; None: one scheme
    layer_pattern: str | None = None
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
    # the sweeps (posenc.lab.sweeps): RoPE models trained at each base (the
    # first one at ``rope_base`` is the ``extrapolation`` model), ALiBi models with
    # every slope multiplied by each scale, YaRN's beta_fast at test time (at L = 32 no
    # pair turns more than 5.1 times, so every beta_fast above that gives 32's split), and one
    # RoPE model with ``wide_heads`` heads (a larger head dimension) at each base
    rope_bases: tuple[float, ...] = (100.0, 1000.0, 10000.0)
    alibi_slope_scales: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
    yarn_betas: tuple[float, ...] = (32.0, 4.0, 2.0, 1.5)
    wide_heads: int = 1
    # sliding-window evaluation (posenc.lab.curves): windows advance by this
    # fraction of their length, scoring only the tokens they add
    sliding_stride: float = 0.25
    # the language model's second budget (rope_budget): RoPE trained ``lm_long_steps``
    # steps with the same initialisation, data and warmup as at ``steps``
    lm_long_steps: int = 1200
    # lm_budget: the same language models at lm_long_steps and at lr x each scale (empty:
    # none; to_dict writes them only when set)
    lm_budget_schemes: tuple[str, ...] = ()
    lm_lr_scales: tuple[float, ...] = ()
    # multi-query associative recall (posenc.lab.recall): ``recall_pairs`` key-value
    # pairs, trained ``recall_steps`` steps at L (warmup ``recall_warmup`` steps;
    # ``None``: recall_steps // 20), the in-view accuracy probed every
    # ``recall_probe_every`` steps on ``recall_probe_sequences`` inputs; scored
    # in view on ``recall_sequences`` inputs, and at contexts ``recall_factors`` x L
    # by distance band, ``recall_band_answers`` answers per band and context; the
    # needle grid puts one pair at each of ``needle_depths`` (fractions of the
    # context) for contexts ``recall_factors`` x L
    recall_steps: int = 3000
    recall_warmup: int | None = None
    recall_pairs: int = 4
    recall_factors: tuple[int, ...] = (1, 2, 4, 8)
    recall_sequences: int = 256
    recall_band_answers: int = 256
    recall_probe_every: int = 250
    recall_probe_sequences: int = 64
    recall_schemes: tuple[str, ...] = ()
    # the trained window-of-L control's schemes, and the largest lead of its training
    # inputs in units of L (to_dict writes both only when schemes are set)
    recall_control_schemes: tuple[str, ...] = ()
    recall_control_lead: int = 1
    # fillers before the far bands' inputs, in units of L (0: no such scoring; to_dict
    # writes it only when set)
    recall_lead: int = 0
    needle_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    # RoPE's needle grid also with each scaling (to_dict writes it only when True)
    needle_scalings: bool = False
    # flip-flop language modelling (posenc.lab.flipflop): defaults of smoke size, which
    # the fflm presets replace; written by to_dict only where they differ from these
    fflm_train_len: int = 32
    fflm_p_ignore: float = 0.8
    fflm_steps: int = 20
    fflm_batch: int = 16
    fflm_lr: float = 3e-3
    fflm_warmup: int = 2
    fflm_eval_p: tuple[float, ...] = (0.8, 0.98, 0.1)
    fflm_eval_lengths: tuple[int, ...] = (32,)
    fflm_eval_reads: int = 256
    fflm_probe_every: int = 10
    fflm_probe_sequences: int = 8
    # the compiled training step (train(compiled=True)); False: the eager step of the
    # stored results (to_dict writes it only when True)
    compile_step: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.passkey_schemes is not None and tuple(self.passkey_schemes) == tuple(self.schemes):
            object.__setattr__(self, "passkey_schemes", None)  # frozen: canonical form, once
        for name in (
            "train_len", "d_model", "layers", "heads", "steps", "batch", "eval_tokens",
            "finetune_factor", "curse_factor", "curse_sequences", "passkey_steps", "passkey_factor",
            "passkey_sequences", "wide_heads", "recall_steps", "recall_pairs", "recall_sequences",
            "lm_long_steps", "recall_band_answers", "recall_probe_every", "recall_probe_sequences",
            "fflm_steps", "fflm_batch", "fflm_warmup", "fflm_eval_reads", "fflm_probe_every",
            "fflm_probe_sequences",
        ):  # fmt: skip
            check_int(name, getattr(self, name), minimum=1)
        check_int("finetune_steps", self.finetune_steps, minimum=0)
        if self.recall_warmup is not None:
            check_int("recall_warmup", self.recall_warmup, minimum=1)
        check_int("seed", self.seed, minimum=0)
        for flag in ("compile_step", "needle_scalings"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        if self.train_len < 4:
            raise ValueError(f"train_len must be >= 4, got {self.train_len}")
        if not self.eval_factors or any(
            check_int("eval_factors", f, minimum=1) < 1 for f in self.eval_factors
        ):
            raise ValueError(f"eval_factors must be positive integers, got {self.eval_factors}")
        for v in self.lm_lr_scales:
            check_float("lm_lr_scales", v, positive=True)
        schemes = self.schemes + self.retrieval_schemes + tuple(self.recall_schemes)
        for s in schemes + tuple(self.lm_budget_schemes):
            check_scheme(s)
            cls = posenc.SCHEMES[s]
            if self.layer_pattern is not None and (
                cls.acts_on != "attention" or cls.shared_across_layers
            ):
                raise ValueError(
                    f"layer_pattern needs schemes that act on attention, one per layer; got {s!r}"
                )
        if self.layer_pattern is not None:
            check_choice("layer_pattern", self.layer_pattern, tuple(LAYER_PATTERNS))
        for name in ("rope_bases", "alibi_slope_scales", "yarn_betas", "needle_depths"):
            for v in getattr(self, name):
                check_float(name, v, positive=name != "needle_depths")
        if not 0 < self.sliding_stride <= 1:
            raise ValueError(f"sliding_stride must be in (0, 1], got {self.sliding_stride}")
        if any(not 0 <= d <= 1 for d in self.needle_depths):
            raise ValueError(f"needle_depths must lie in [0, 1], got {self.needle_depths}")
        for f in self.recall_factors:
            check_int("recall_factors", f, minimum=1)
        check_int("recall_lead", self.recall_lead, minimum=0)
        check_int("recall_control_lead", self.recall_control_lead, minimum=1)
        for s in self.recall_control_schemes:
            check_scheme(s)
        check_float("fflm_lr", self.fflm_lr, positive=True)
        if not self.fflm_eval_p or not self.fflm_eval_lengths:
            raise ValueError("fflm_eval_p and fflm_eval_lengths must not be empty")
        fflm_p = [("fflm_p_ignore", self.fflm_p_ignore)]
        for name, p in fflm_p + [("fflm_eval_p", p) for p in self.fflm_eval_p]:
            if not 0 <= check_float(name, p) < 1:
                raise ValueError(f"{name} must lie in [0, 1), got {p}")
        fflm_n = [("fflm_train_len", self.fflm_train_len)]
        for name, n in fflm_n + [("fflm_eval_lengths", n) for n in self.fflm_eval_lengths]:
            if check_int(name, n, minimum=4) % 2:
                raise ValueError(f"{name} must be even (instruction, bit pairs), got {n}")

    @property
    def retrieval_schemes(self) -> tuple[str, ...]:
        """The schemes ``passkey`` trains: ``passkey_schemes``, or ``schemes`` when ``None``."""
        return self.schemes if self.passkey_schemes is None else tuple(self.passkey_schemes)

    @property
    def table_len(self) -> int:
        """Rows of every learned table: the longest length any experiment evaluates."""
        return self.train_len * max(
            max(self.eval_factors),
            self.passkey_factor,
            self.curse_factor,
            max(self.recall_factors) + self.recall_lead,
            1 + self.recall_control_lead if self.recall_control_schemes else 1,
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field, tuples as lists; ``passkey_schemes`` written out in full; the FFLM
        fields (``fflm_*``) only where they differ from their defaults."""
        d = {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in vars(self).items()
            if not (k.startswith("fflm_") and v == _FFLM_DEFAULTS[k])
            and not (k == "layer_pattern" and v is None)
            and not (k in ("compile_step", "needle_scalings") and v is False)
            and not (k == "recall_lead" and v == 0)
            and not (k in ("lm_budget_schemes", "lm_lr_scales") and not v)
            and not (
                k in ("recall_control_schemes", "recall_control_lead")
                and not self.recall_control_schemes
            )
        }
        return dict(d, passkey_schemes=list(self.retrieval_schemes))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LabConfig:
        """The config of a stored run.  Fields of ``LEGACY_FIELDS`` (settings of
        experiments since removed) are dropped; any other unknown field is an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known - set(LEGACY_FIELDS))
        if unknown:
            raise ValueError(f"config must hold LabConfig fields only, got {', '.join(unknown)}")
        # JSON values: each field's type is checked by __post_init__
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in known
        }
        return cls(**fields)


# The FFLM fields' defaults: to_dict leaves a field out at its default, so the configs
# stored before these fields existed compare equal to their presets.
_FFLM_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(LabConfig) if f.name.startswith("fflm_")
}

#: Fields of stored configs that set experiments no longer in the lab: ``recall_long_steps``
#: and ``recall_long_schemes`` set ``recall_budget`` (RoPE, xPos, Kerple trained 9000 steps
#: with their own seeds), replaced by one recall budget for every scheme.
LEGACY_FIELDS = ("recall_long_steps", "recall_long_schemes")


#: The schemes of the stored runs: the eight of the first stored run, then the other
#: five registered ones (every entry of posenc.SCHEMES).
FULL_SCHEMES = (
    "none", "sinusoidal", "learned", "rope", "alibi", "t5", "xpos", "kerple",
    "shaw", "transformer_xl", "da", "fire", "cope",
)  # fmt: skip

_FULL = LabConfig(
    steps=300,
    passkey_steps=300,
    eval_tokens=8192,
    passkey_sequences=128,
    schemes=FULL_SCHEMES,
    recall_steps=9000,
    recall_warmup=150,
)

#: The schemes of the ``fflm`` presets: the four of the PaTH paper's Table 1 (RoPE,
#: stick-breaking, FoX, PaTH), then NoPE, ALiBi and every other registered scheme that
#: runs in a one-layer model at every evaluation length (see :mod:`posenc.lab.flipflop`).
FFLM_SCHEMES = (
    "rope", "stickbreaking", "fox", "path", "none", "alibi",
)  # fmt: skip

# the flip-flop model of the PaTH paper (§4.1): one layer, two heads, width 64 (~50k
# parameters), RoPE at base 10^4; the FFLM paper's batch (16) and warmup (50 steps), at the
# budget of posenc.lab.fflm_propositions.BUDGET: 400 steps (the paper's 10k do not fit a
# 2-core CPU), the in-distribution errors probed every 50 steps, about 8192 reads scored
# per split
_FFLM = LabConfig(
    d_model=64,
    layers=1,
    heads=2,
    rope_base=10000.0,
    schemes=FFLM_SCHEMES,
    fflm_train_len=512,
    fflm_steps=400,
    fflm_batch=16,
    fflm_lr=3e-4,
    fflm_warmup=50,
    fflm_eval_lengths=(512,),
    fflm_eval_reads=8192,
    fflm_probe_every=50,
    fflm_probe_sequences=64,
)

# fflm's models trained at 128 tokens, scored at 128, 512 and 2048 in distribution and
# dense, about 2048 reads each (the sparse split at 2048 tokens would cost more than all
# the training: see posenc.lab.fflm_propositions.BUDGET)
_FFLM_LENGTH = dataclasses.replace(
    _FFLM,
    fflm_train_len=128,
    fflm_eval_lengths=(128, 512, 2048),
    fflm_eval_p=(0.8, 0.1),
    fflm_eval_reads=2048,
)

# the recall task in a 4-layer model, trained with the recall-warmup recipe
_PATTERN_4L = dataclasses.replace(_FULL, layers=4, recall_warmup=450)

#: The settings of the named runs (``python -m posenc.lab --preset NAME``): ``"full"``
#: and ``"recall"`` (the stored runs, the same :class:`LabConfig`; they run other
#: experiments), ``"recall-warmup"`` (the recall preset with a longer warmup, an
#: ablation), ``"fflm"`` (flip-flop language modelling as in the PaTH paper's Table 1:
#: one layer, two heads, width 64, trained and scored at 512 tokens), ``"fflm-length"``
#: (the same models trained at 128 tokens and scored at 128, 512 and 2048),
#: ``"irope"``, ``"rnope-swa"``, ``"smollm3"`` and ``"gemma3-bases"`` (RoPE in a 4-layer
#: model with that :data:`~posenc.lab.LAYER_PATTERNS` pattern, the recall-warmup
#: preset's settings otherwise), ``"baseline-4l"`` (their all-RoPE and all-NoPE baselines),
#: ``"fflm-length-irope"`` ... ``"fflm-length-gemma3-bases"`` and ``"fflm-length-4l"``
#: (the same patterns and baselines at fflm's width on fflm-length's task) and
#: ``"smoke"`` (every experiment in seconds, for the tests).
PRESETS = {
    # The stored runs, sized to the shared 2-core machine (see the README and each
    # results file's meta): 300 steps per language model (and 1200 for RoPE's second
    # budget, rope_budget); 32 evaluation sequences at 16L (max(32, eval_tokens //
    # length) at every length), 128 per passkey band; every registered scheme.
    "full": _FULL,
    # multi-query recall (python -m posenc.lab --preset recall): the full preset's
    # settings; every scheme trained recall_steps = 9000 steps with a warmup of 150 (the
    # warmup of the 3000-step discovery run).  PRESET_EXPERIMENTS says what each runs
    "recall": _FULL,
    # an ablation of the recall preset, not a test of its claims: the warmup of the
    # discovery runs' 9,000-step models (450 steps, steps // 20) instead of 150, for RoPE
    # and xPos on seeds 5-10, so that each model pairs with the same seed's (same
    # initialisation and data) in recall-confirmation.json.  Rule fixed before the run:
    # the warmup decides whether they learn when, over both schemes' pairs, the seeds
    # that learn with 450 and not with 150 outnumber the reverse by an exact two-sided
    # sign test at 5%.  Those seeds then chose the verdicts of a second freeze
    # (posenc.lab.warmup_propositions), confirmed on seeds 15-24
    "recall-warmup": dataclasses.replace(_FULL, recall_warmup=450),
    # flip-flop language modelling (posenc.lab.flipflop), frozen claims in
    # posenc.lab.fflm_propositions: the PaTH paper's Table 1 ...
    "fflm": _FFLM,
    # ... and its length axis
    "fflm-length": _FFLM_LENGTH,
    # per-layer position patterns as 2025's models ship them (posenc.lab.patterns): the
    # recall preset's settings with 4 layers and recall-warmup's 450 warmup steps (with
    # 150, 1 of 20 rotary models learned the task; with 450, 32 of 32); each trains RoPE
    # with the pattern on the seeds of baseline-4l's RoPE model (same initial weights,
    # same data) ...
    **{
        name: dataclasses.replace(_PATTERN_4L, schemes=("rope",), layer_pattern=name)
        for name in LAYER_PATTERNS
    },
    # ... and its baselines of the same size: every layer RoPE, every layer NoPE.
    # Reported, no propositions; the rule, fixed before the runs (seeds 0-4): for each
    # pattern and each band beyond L at 8L (bands from L + 1, gains.recall_gains), the
    # seeds' gain over the window-of-L control, and its paired difference from the
    # all-RoPE model's gain, each with a 95% t-interval; a pattern "changes" a band when
    # that difference's interval, Holm-adjusted over the 4 patterns x 3 bands, excludes
    # 0 and its mean lies outside gains.SESOI_ACCURACY.  The exact Wilcoxon p is printed
    # beside it; with 5 seeds it cannot fall below 1/16, so it decides nothing here.
    "baseline-4l": dataclasses.replace(_PATTERN_4L, schemes=("rope", "none")),
    # the same patterns on fflm-length's task (trained at 128 tokens, scored at 128, 512
    # and 2048) in a 4-layer model of the fflm width, against its all-RoPE and all-NoPE
    # baselines (fflm-length-4l); reported, no propositions
    **{
        f"fflm-length-{name}": dataclasses.replace(
            _FFLM_LENGTH, layers=4, schemes=("rope",), layer_pattern=name
        )
        for name in LAYER_PATTERNS
    },
    "fflm-length-4l": dataclasses.replace(_FFLM_LENGTH, layers=4, schemes=("rope", "none")),
    # the recall study under one recipe (the fourth freeze, posenc.lab.recipe_propositions,
    # seeds 25-34): every scheme with recall-warmup's 450 warmup steps; the eight schemes
    # with stated recall claims also train a window-of-L control (same initialisation and
    # batches, each moved by 0..L fillers); the far bands at 8L scored again after 8L
    # fillers; RoPE's needle grid with each scaling.  The moved far bands (recall_lead) are
    # reported, not frozen; their reading rule, written before any of their results was
    # seen: per scheme and far band at 8L, the seeds' paired difference of the gain over
    # the masked control (bands from L + 1) with the 8L lead minus without it, and its 95%
    # t-interval; position from the start "matters" for a cell when the two-sided t-test
    # of no difference, Holm-adjusted over every scheme x band, gives p < 0.05 and the
    # mean lies outside +-gains.SESOI_ACCURACY; the exact Wilcoxon p is printed beside it
    "recall-recipe": dataclasses.replace(
        _FULL,
        recall_warmup=450,
        recall_control_schemes=FULL_SCHEMES[:8],
        recall_control_lead=1,
        recall_lead=8,
        needle_scalings=True,
    ),  # fmt: skip
    # ... and its language models: the eight schemes at 300 steps, at lm_long_steps and
    # at a third of the peak learning rate, from the same initialisation and data
    "lm-budget": dataclasses.replace(
        _FULL,
        schemes=FULL_SCHEMES[:8],
        lm_budget_schemes=FULL_SCHEMES[:8],
        lm_lr_scales=(1 / 3,),
    ),  # fmt: skip
    # what the tests and the chapter re-run: every experiment, every scheme, in seconds
    "smoke": LabConfig(
        train_len=8,
        eval_factors=(1, 2, 4),
        d_model=32,
        steps=40,
        lm_long_steps=80,
        batch=16,
        eval_tokens=256,
        finetune_steps=8,
        finetune_factor=2,
        curse_factor=2,
        curse_sequences=32,
        passkey_steps=40,
        passkey_factor=4,
        passkey_sequences=32,
        recall_steps=40,
        recall_pairs=1,
        recall_factors=(1, 2, 4),
        recall_sequences=32,
        recall_band_answers=32,
        recall_probe_every=10,
        recall_probe_sequences=16,
    ),
}


def rope_scaling_for(method: str, factor: float, train_len: int) -> posenc.RopeScaling | None:
    """The :class:`posenc.RopeScaling` of ``method`` (one of :data:`ROPE_METHODS`) at ``factor``.

    Parameters
    ----------
    method
        One of :data:`ROPE_METHODS`; anything else raises ``ValueError`` naming ``method``.
    factor
        How far past the training length the context reaches (``length / train_len``).
    train_len
        The length the model was trained at (YaRN's and Llama 3's original context).

    Returns
    -------
    The scaling to set on a RoPE model (:meth:`TinyDecoder.set_rope_scaling`), or
    ``None`` (plain RoPE) for ``"none"`` or ``factor == 1``.
    """
    check_choice("method", method, ROPE_METHODS)
    if method == "none" or factor == 1:
        return None
    makers: dict[str, Callable[[], posenc.RopeScaling]] = {
        "pi": lambda: posenc.RopeScaling.linear(factor),
        "ntk": lambda: posenc.RopeScaling.ntk(factor),
        "yarn": lambda: posenc.RopeScaling.yarn(factor, train_len),
        "llama3": lambda: posenc.RopeScaling.llama3(factor, train_len),
    }
    return makers[method]()


class Lab:
    """Trains the models an experiment asks for, once, and remembers them.

    Parameters
    ----------
    config
        The run's settings; default ``PRESETS["full"]``.
    progress
        Show a progress bar (``tqdm``) while a model trains.
    device
        Where the models train and run; the data is drawn on the CPU, so a seed
        sees the same data on any device.

    Attributes
    ----------
    lm, retrieval, recall, fflm
        The four tasks: :class:`LanguageTask`, :class:`RetrievalTask`,
        :class:`RecallTask` (``config.recall_pairs`` pairs) and :class:`FlipFlopTask`
        (FFL(``config.fflm_p_ignore``), the flip-flop models' training data).
    """

    def __init__(
        self,
        config: LabConfig | None = None,
        *,
        progress: bool = False,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config = PRESETS["full"] if config is None else config
        self.progress = progress
        self.device = torch.device(device)  # data is drawn on the CPU, models run here
        self.lm = LanguageTask()
        self.retrieval = RetrievalTask()
        self.recall = RecallTask(pairs=self.config.recall_pairs)
        self.fflm = FlipFlopTask(self.config.fflm_p_ignore)
        self._tasks: dict[str, LanguageTask | RetrievalTask | RecallTask | FlipFlopTask] = {
            "lm": self.lm,
            "passkey": self.retrieval,
            "recall": self.recall,
            "fflm": self.fflm,
        }
        self._models: dict[_ModelKey, tuple[TinyDecoder, list[float]]] = {}
        #: ``{(task, scheme, ...): [{"step", "accuracy", "accuracy_round1",
        #: "accuracy_round2"}, ...]}``: the in-view accuracy of each recall model,
        #: probed during training every ``recall_probe_every`` steps; for a flip-flop
        #: model ``[{"step", "reads", "errors", "loss"}, ...]``, its in-distribution
        #: read errors probed every ``fflm_probe_every`` steps
        self.probes: dict[_ModelKey, list[dict[str, float]]] = {}

    def model(
        self, task: str, scheme: str, inject: str = "input", **variant: float
    ) -> tuple[TinyDecoder, list[float]]:
        """``(model, curve)``: a :class:`TinyDecoder` trained at ``train_len`` on ``task``.

        ``task`` ``"fflm"``: trained with the ``fflm_*`` settings instead (length
        ``fflm_train_len - 1`` inputs, ``fflm_steps``, ``fflm_batch``, ``fflm_lr``,
        ``fflm_warmup``), its read errors probed during training (:attr:`probes`).

        ``variant``: :class:`TinyDecoder` settings that differ from the
        configuration's, for the sweeps (``rope_base``, ``heads``,
        ``alibi_slope_scale``), or a training budget other than the task's
        (``steps``, or the peak learning rate ``lr``).  A settings variant is a
        model of its own, with its own seed; a budget variant keeps the
        initialisation, the training data and the warmup of the task's own budget,
        so that only the budget changes.  With no variant the seeds are those of
        the stored runs.

        ``window`` (task ``"recall"`` only, equal to ``train_len``): the trained
        window-of-``L`` control, a model whose attention sees its last ``L`` keys
        in training and after, trained on the full model's recall batches (same
        initialisation, same data seed) each moved by ``0 .. recall_control_lead *
        L`` fillers (``posenc.lab.tasks.LeadRecallTask``).
        """
        check_choice("task", task, tuple(self._tasks))
        scheme = check_scheme(scheme)
        budget = ("steps", "lr")
        for name in variant:
            check_choice(
                "variant", name, ("rope_base", "heads", "alibi_slope_scale", "window", *budget)
            )
        if "window" in variant and (task != "recall" or variant["window"] != self.config.train_len):
            raise ValueError(
                "variant window is the recall task's trained control, of train_len = "
                f"{self.config.train_len} keys; got task={task!r}, window={variant['window']!r}"
            )
        key = (task, scheme, inject) + tuple(sorted(variant.items()))
        if key not in self._models:
            c = self.config
            data: LanguageTask | RetrievalTask | RecallTask | FlipFlopTask | LeadRecallTask
            data = self._tasks[task]
            # the seeds leave out the budget and the control's window: such a variant
            # starts from the same model and sees the same data
            same = (task, scheme, inject) + tuple(
                sorted((k, v) for k, v in variant.items() if k not in (*budget, "window"))
            )
            torch.manual_seed(seed_for(c.seed, "init", *same))
            # FFLM: sequences of fflm_train_len tokens, so fflm_train_len - 1 inputs; a
            # learned table has a row for every position any evaluation reaches
            fflm = task == "fflm"
            length = c.fflm_train_len - 1 if fflm else c.train_len
            rows = max(c.fflm_eval_lengths) - 1 if fflm else c.table_len
            # TinyDecoder's keyword arguments (ints, a str, a float, None)
            settings: dict[str, Any] = dict(
                d_model=c.d_model,
                layers=c.layers,
                heads=c.heads,
                inject=inject,
                rope_base=c.rope_base,
                table_len=max(rows, length) if scheme == "learned" else None,
            )
            steps = {"lm": c.steps, "passkey": c.passkey_steps, "recall": c.recall_steps,
                     "fflm": c.fflm_steps}[task]  # fmt: skip
            warmup = {"recall": c.recall_warmup, "fflm": c.fflm_warmup}.get(task)
            warmup = max(1, steps // 20) if warmup is None else warmup  # the task's own
            shape = dict(variant)  # the model's settings: all but the training budget
            steps = check_int("steps", shape.pop("steps", steps), minimum=0)
            lr = check_float("lr", shape.pop("lr", c.fflm_lr if fflm else c.lr), positive=True)
            window = shape.pop("window", None)
            if window is not None:  # the control: every batch moved by a random lead
                data = LeadRecallTask(
                    self.recall, c.recall_control_lead * c.train_len,
                    seed_for(c.seed, "control-lead", *same),
                )  # fmt: skip
            kwargs = {**settings, **shape}
            if c.layer_pattern is not None:  # every model of the run, at its own length
                kwargs["pattern"] = layer_pattern(
                    c.layer_pattern, c.layers, length, kwargs["rope_base"]
                )
            model = TinyDecoder(data.vocab, scheme, length, **kwargs).to(self.device)
            model.window = None if window is None else int(window)
            probe = None
            if task == "recall":
                probe = self._recall_probe(model, self.probes.setdefault(key, []))
            elif fflm:
                probe = self._fflm_probe(model, self.probes.setdefault(key, []))
            curve = train(
                model,
                data,  # type: ignore[arg-type]  # FlipFlopTask: the same batch() protocol
                length=length,
                steps=steps,
                batch=c.fflm_batch if fflm else c.batch,
                lr=lr,
                seed=seed_for(c.seed, "data", *same),
                progress=self.progress,
                desc=f"{task} {scheme}"
                + ("" if inject == "input" else f" ({inject})")
                + "".join(f" {k}={v}" for k, v in sorted(variant.items())),
                warmup=min(warmup, max(1, steps)),
                callback=probe,
                callback_every=c.fflm_probe_every if fflm else c.recall_probe_every,
                # FFLM: one value of the curve per probe interval (fflm_curve pairs them)
                log_every=c.fflm_probe_every if fflm else 10,
                compiled=c.compile_step,
            )
            self._models[key] = (model, curve)
        return self._models[key]

    def _recall_probe(
        self, model: TinyDecoder, log: list[dict[str, float]]
    ) -> Callable[[int], None]:
        """A training callback that appends the in-view accuracy (every round, and each
        round alone) on fixed probe inputs to ``log``."""
        c, task = self.config, self.recall
        g = torch.Generator().manual_seed(seed_for(c.seed, "recall-probe"))
        inputs, targets, weights = task.batch(c.recall_probe_sequences, c.train_len, g)

        def probe(step: int) -> None:
            log.append({"step": step, **round_accuracies(model, task, inputs, targets, weights)})

        return probe

    def _fflm_probe(self, model: TinyDecoder, log: list[dict[str, float]]) -> Callable[[int], None]:
        """A training callback that appends the in-distribution read errors and read loss
        on fixed probe sequences (FFL(``fflm_p_ignore``) at the training length) to ``log``."""
        c, task = self.config, self.fflm
        g = torch.Generator().manual_seed(seed_for(c.seed, "fflm-probe"))
        inputs, targets, weights = task.batch(c.fflm_probe_sequences, c.fflm_train_len - 1, g)

        def probe(step: int) -> None:
            reads, errors, loss = read_errors(model, inputs, targets, weights)
            log.append({"step": step, "reads": reads, "errors": errors, "loss": loss})

        return probe

    @overload
    def lm_loss(
        self,
        model: torch.nn.Module,
        length: int,
        name: str = ...,
        per_sequence: Literal[False] = ...,
    ) -> torch.Tensor: ...

    @overload
    def lm_loss(
        self, model: torch.nn.Module, length: int, name: str, per_sequence: Literal[True]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    @overload
    def lm_loss(
        self, model: torch.nn.Module, length: int, *, per_sequence: Literal[True]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def lm_loss(
        self, model: torch.nn.Module, length: int, name: str = "length", per_sequence: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
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
        return float(self.lm.floor(length).mean().item())


def loss_row(lab: Lab, model: torch.nn.Module, f: int, **keys: Any) -> Row:
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
        "loss": rounded(loss),
        "floor": rounded(floor),
        "excess": rounded(loss - floor),
        "eval_se": rounded(each.std().item() / math.sqrt(len(each))),
    }
