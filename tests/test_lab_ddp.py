"""The lab's training loop under DistributedDataParallel: 2 CPU processes, gloo (issue 19).

Two processes, each with its half of the same global batch, must give the
loss curve and the weights of one process training on the whole batch,
within rounding (the gradient is averaged over processes in float32).
"""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import posenc.lab as lab


def _train(rank=0, world=1, init=None, out=None):
    if world > 1:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    task = lab.LanguageTask()
    model = lab.TinyDecoder(task.vocab, "alibi", 8, d_model=16, heads=2)
    curve = lab.train(model, task, length=8, steps=6, batch=8, lr=1e-2, seed=3, log_every=2)
    if world > 1:
        if rank == 0:
            torch.save((curve, model.state_dict()), out)
        dist.destroy_process_group()
    return curve, model.state_dict()


def test_two_gloo_processes_train_like_one(tmp_path):
    curve, state = _train()
    out = tmp_path / "ddp.pt"
    mp.spawn(_train, args=(2, f"file://{tmp_path / 'store'}", str(out)), nprocs=2, join=True)
    ddp_curve, ddp_state = torch.load(out)
    assert max(abs(a - b) for a, b in zip(curve, ddp_curve, strict=True)) < 1e-5, (curve, ddp_curve)
    for name, value in state.items():
        assert torch.allclose(value, ddp_state[name], atol=1e-5, rtol=1e-4), name
    # a control: a different seed moves the weights well beyond that tolerance
    torch.manual_seed(1)
    other = lab.TinyDecoder(lab.LanguageTask().vocab, "alibi", 8, d_model=16, heads=2)
    assert (other.state_dict()["head.weight"] - state["head.weight"]).abs().max() > 1e-2
