"""The README's examples run as written (readers copy them first)."""

import re
from pathlib import Path

import pytest
import torch

import posenc

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def namespace():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 3, "the README should show the API and a decoder block in python blocks"
    names: dict = {}
    exec(compile("\n".join(blocks), str(README), "exec"), names)  # noqa: S102
    return names


def test_readme_python_examples_run(namespace):
    # every scheme the README names produced an attention output of the input's shape
    assert namespace["out"].shape == namespace["q"].shape
    assert namespace["q_rot"].dtype == namespace["q"].dtype


def test_decoder_block_decodes_step_by_step_as_the_full_pass(namespace):
    block, tokens, keep = namespace["block"], namespace["tokens"], namespace["keep"]
    full, decoded, cache = namespace["full"], namespace["decoded"], namespace["cache"]
    assert block.wkv.out_features < 2 * block.wq.out_features  # grouped-query heads
    assert decoded.shape == full.shape == tokens.shape
    assert (decoded - full).abs().max().item() < 1e-12
    # the cache holds every token once, rotated at its own position (item 1 counts from 0
    # at its first real token); keys stored rotated, not recomputed at every step
    assert cache.length == tokens.shape[1]
    assert cache.positions[1].tolist() == [0, 0, 0, 0, 1, 2, 3, 4, 5, 6]
    # independent of both code paths: the padded item equals the same tokens unpadded
    pad = int((~keep[1]).sum())
    alone = block(tokens[1:, pad:], keep[1:, pad:])
    assert (full[1:, pad:] - alone).abs().max().item() < 1e-12
    # and RoPE matters here: without it the decode would not equal the full pass
    unrotated = posenc.KVCache(None)
    steps = [block(tokens[:, :4], keep[:, :4], unrotated)]
    steps += [block(tokens[:, t : t + 1], keep[:, : t + 1], unrotated) for t in range(4, 10)]
    assert (torch.cat(steps, 1) - full).abs().max().item() > 1e-3
