"""posenc.lab.train(compiled=True): the compiled training step trains like the eager one.

The compiled step (forward pass and loss compiled by ``torch.compile``, fused
AdamW) does the same arithmetic as the eager step in another order, so its runs
are not bitwise the eager runs.  What must hold is that it trains the same
models in distribution.  The rule, fixed before any number was looked at: for
each scheme, three seeds (their own initialisation and data) are trained with
both steps at a reduced size, and at every logged point of the loss curve the
mean over the seeds of the compiled runs lies within two standard errors of the
mean of the eager runs (the standard error of a difference of two means of three
seeds, from the eager seeds' standard deviation at that point), plus 1e-3 nats
for the points where the seeds agree to rounding.  A step that trained
differently (another learning rate, no clipping, the wrong loss) moves the
curves by much more than the seed spread over 60 steps.
"""

import math
import warnings

import pytest
import torch

import posenc.lab as lab
from posenc import _compile
from posenc.lab import LabConfig, LanguageTask, TinyDecoder, train
from posenc.lab.train import last_step

pytestmark = pytest.mark.skipif(
    _compile.missing_compiler("cpu") is not None, reason="torch.compile needs a C++ compiler"
)

SEEDS = (0, 1, 2)
SIZE = dict(d_model=16, layers=1, heads=2)  # the smallest graph: compiling costs seconds
STEPS, LENGTH, BATCH = 60, 8, 16


def _curve(scheme, seed, compiled, lr=1e-2):
    task = LanguageTask()
    torch.manual_seed(seed)
    model = TinyDecoder(task.vocab, scheme, LENGTH, **SIZE)
    curve = train(
        model, task, length=LENGTH, steps=STEPS, batch=BATCH, lr=lr, seed=1000 + seed,
        log_every=10, compiled=compiled,
    )  # fmt: skip
    return curve, model


def _within_seed_spread(eager, fast):
    """The rule of the module docstring: (passes, the worst point's excess over its bound)."""
    n = len(eager)
    worst = -math.inf
    for point in range(len(eager[0])):
        a = [c[point] for c in eager]
        b = [c[point] for c in fast]
        mean_a, mean_b = sum(a) / n, sum(b) / n
        sd = math.sqrt(sum((x - mean_a) ** 2 for x in a) / (n - 1))
        bound = 2 * sd * math.sqrt(2 / n) + 1e-3
        worst = max(worst, abs(mean_a - mean_b) - bound)
    return worst <= 0, worst


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_compiled_step_trains_like_the_eager_step_within_the_seed_spread(scheme):
    torch.set_num_threads(1)
    eager = [_curve(scheme, s, False)[0] for s in SEEDS]
    fast = []
    for s in SEEDS:
        curve, _ = _curve(scheme, s, True)
        assert last_step() == "compiled", last_step()
        fast.append(curve)
    ok, worst = _within_seed_spread(eager, fast)
    assert ok, f"{scheme}: the compiled curves' mean leaves the seed spread by {worst:.4f} nats"
    # and it trained: every compiled run's loss fell
    assert all(c[-1] < c[0] - 0.1 for c in fast)


def test_the_rule_sees_a_step_that_trains_differently():
    # the same comparison against eager runs at a tenth of the learning rate must fail:
    # the rule is not too loose to notice another training
    torch.set_num_threads(1)
    eager = [_curve("rope", s, False)[0] for s in SEEDS]
    slow = [_curve("rope", s, True, lr=1e-3)[0] for s in SEEDS]
    ok, worst = _within_seed_spread(eager, slow)
    assert not ok and worst > 0.05


def test_compiled_step_is_deterministic_given_the_seed():
    torch.set_num_threads(1)
    a, model_a = _curve("rope", 0, True)
    b, model_b = _curve("rope", 0, True)
    assert a == b
    for p, q in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(p, q)


class _Breaks(torch.nn.Module):
    """A model whose forward cannot be one graph (a deliberate graph break)."""

    def __init__(self, vocab):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 8)
        self.head = torch.nn.Linear(8, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        torch._dynamo.graph_break()
        return self.head(x)


def test_a_step_that_does_not_compile_trains_eagerly_and_says_so():
    task = LanguageTask()
    torch.manual_seed(0)
    model = _Breaks(task.vocab)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        curve = train(model, task, length=LENGTH, steps=20, batch=BATCH, compiled=True)
    assert last_step().startswith("eager (compile failed: ")
    assert any("did not compile" in str(w.message) for w in caught)
    assert len(curve) == 2 and all(math.isfinite(x) for x in curve)
    train(model, task, length=LENGTH, steps=1, batch=BATCH)
    assert last_step() == "eager"


def test_compiled_must_be_a_bool():
    task = LanguageTask()
    model = TinyDecoder(task.vocab, "none", LENGTH, **SIZE)
    with pytest.raises(TypeError, match="compiled must be a bool, got int"):
        train(model, task, length=LENGTH, steps=1, batch=2, compiled=1)


def test_compile_step_is_a_config_field_left_out_of_stored_configs_when_false():
    smoke = lab.PRESETS["smoke"]
    assert smoke.compile_step is False and "compile_step" not in smoke.to_dict()
    fast = LabConfig(compile_step=True)
    assert fast.to_dict()["compile_step"] is True
    assert LabConfig.from_dict(fast.to_dict()) == fast
    assert LabConfig.from_dict(smoke.to_dict()) == smoke
    with pytest.raises(ValueError, match="compile_step must be a bool"):
        LabConfig(compile_step=1)
