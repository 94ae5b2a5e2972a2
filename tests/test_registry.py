"""posenc.registry: SCHEMES, the uniform constructor and the metadata the book's tables read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import posenc
import posenc.lab

BIB = Path(__file__).resolve().parents[1] / "references.bib"


def test_every_entry_is_exported_and_trained_by_the_lab():
    for name, cls in posenc.SCHEMES.items():
        assert getattr(posenc, cls.__name__) is cls, name
        assert cls.acts_on in ("attention", "input"), name
        assert (cls.acts_on == "attention") == issubclass(cls, posenc.PositionalScheme), name
    assert posenc.lab.SCHEMES == tuple(posenc.SCHEMES)


@pytest.mark.parametrize("name", list(posenc.SCHEMES))
def test_build_gives_a_module_for_the_heads_and_head_size(name):
    cls = posenc.SCHEMES[name]
    scheme = cls.build(4, 16, max_len=32, causal=True)
    assert isinstance(scheme, cls) and isinstance(scheme, torch.nn.Module)
    if cls.acts_on == "input":  # a table of the model width, added to the embeddings
        assert scheme.encode(torch.arange(5)).shape == (5, 64)
    else:
        q = torch.randn(2, 4, 6, 16)
        if scheme.reads_input:  # it needs the layer input (width 4 * 16 by default): bind it
            with pytest.raises((TypeError, ValueError, RuntimeError), match="bind"):
                posenc.attention(q, q, q, encoding=scheme, causal=True)
            scheme = scheme.bind(torch.randn(2, 6, 64))
        assert posenc.attention(q, q, q, encoding=scheme, causal=True).shape == q.shape


@pytest.mark.parametrize("name", list(posenc.SCHEMES))
def test_every_reference_is_in_the_bibliography(name):
    keys = set(re.findall(r"^@\w+\{([^,]+),", BIB.read_text(), re.M))
    assert posenc.SCHEMES[name].reference in keys, name


def test_the_table_agrees_with_what_the_paths_do():
    rows = {r["name"]: r for r in posenc.scheme_table(4, 16)}
    assert list(rows) == list(posenc.SCHEMES)
    for name, row in rows.items():
        if "attend" in row["hooks"]:
            assert not row["fused"] and row["quadratic_memory"], name
    assert rows["alibi"]["fused"] and rows["t5"]["fused"] and not rows["shaw"]["fused"]
    assert rows["t5"]["parameters"] == posenc.T5RelativeBias(4).weight.numel()
    assert rows["t5"]["shared_across_layers"] and not rows["alibi"]["shared_across_layers"]
