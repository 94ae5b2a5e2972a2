"""The registry of positional schemes: :data:`SCHEMES`, a short name for each scheme class.

The lab builds its models from it, the conformance tests run every entry that
acts on attention through the same battery, and the book's tables of schemes
are generated from it (:func:`scheme_table`).  Nothing else in posenc lists the
schemes by name.

Adding a scheme takes its module (a :class:`posenc.PositionalScheme` subclass
with its ``__all__``) and one line in the table ``_ENTRIES`` of ``posenc/registry.py``:
``"name": "module:Class"``.  ``import posenc`` then imports the module and
exports its ``__all__`` (``posenc.Class``), the lab trains it and the tests
check it.

Each class carries its metadata (see :class:`posenc.PositionalScheme`):
``acts_on`` (``"attention"``, or ``"input"`` for the absolute tables added to
the embeddings), ``hooks()``, ``fused()``, ``quadratic_memory``, ``reference``,
``shared_across_layers``; and its uniform constructor ``build(num_heads,
head_dim, *, max_len=None, causal=True, **options)``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["SCHEMES", "scheme_table"]

# name -> "module:Class" (modules of this package).  One line per scheme; the order is
# the order of the lab's runs and of the book's tables.
_ENTRIES = {
    "none": "scheme:NoPE",
    "sinusoidal": "sinusoidal:SinusoidalEmbedding",
    "learned": "learned:LearnedEmbedding",
    "rope": "rope:RotaryEmbedding",
    "alibi": "alibi:ALiBi",
    "t5": "t5:T5RelativeBias",
    "shaw": "shaw:ShawRelativeAttention",
    "transformer_xl": "transformer_xl:TransformerXLScheme",
    "da": "da_transformer:DAAttention",
    "xpos": "xpos:XPos",
    "kerple": "kerple:Kerple",
    "fire": "fire:FIRE",
    "cope": "cope:CoPE",
    "p_rope": "prope:PartialRotaryEmbedding",
    "stickbreaking": "stickbreaking:StickBreakingAttention",
    "fox": "forgetting:ForgettingAttention",
    "path": "path:PathAttention",
}


def _load(path: str) -> type[Any]:
    module, name = path.split(":")
    cls: type[Any] = getattr(importlib.import_module(f"{__package__}.{module}"), name)
    return cls


#: Short name -> scheme class, in the order the schemes were registered.
SCHEMES: dict[str, type[Any]] = {name: _load(path) for name, path in _ENTRIES.items()}


def modules() -> list[ModuleType]:
    """The modules of the registered schemes (``import posenc`` exports their ``__all__``)."""
    return list(
        dict.fromkeys(
            importlib.import_module(f"{__package__}.{p.split(':')[0]}") for p in _ENTRIES.values()
        )
    )


def scheme_table(num_heads: int = 8, head_dim: int = 64) -> list[dict[str, Any]]:
    """One row per registered scheme: what the book's tables of schemes show.

    Keys: ``name``, ``class``, ``acts_on`` (``"attention"`` or ``"input"``),
    ``hooks`` (the :class:`~posenc.PositionalScheme` hooks it overrides, or
    ``("input",)``), ``fused`` (FlexAttention computes it exactly, no O(n^2)
    bias), ``quadratic_memory`` (its eager path builds an O(q_len * k_len)
    tensor beside the scores), ``parameters`` (learnable parameters of
    ``build(num_heads, head_dim)``), ``shared_across_layers`` and
    ``reference`` (a ``references.bib`` key).

    Parameters
    ----------
    num_heads, head_dim
        The size each scheme is built at (``cls.build(num_heads, head_dim)``),
        which sets the ``parameters`` column.

    Returns
    -------
    list of dict
        One row per entry of :data:`posenc.SCHEMES`, in its order.

    Examples
    --------
    >>> import posenc
    >>> rows = {r["name"]: r for r in posenc.scheme_table(num_heads=8, head_dim=64)}
    >>> [name for name, r in rows.items() if r["acts_on"] == "input"]
    ['sinusoidal', 'learned']
    >>> rows["alibi"]["hooks"], rows["alibi"]["fused"], rows["alibi"]["parameters"]
    (('score_mod', 'bias'), True, 0)
    >>> rows["t5"]["parameters"], rows["t5"]["shared_across_layers"]   # 32 buckets x 8 heads
    (256, True)
    >>> sorted(name for name, r in rows.items() if not r["quadratic_memory"])
    ['learned', 'none', 'p_rope', 'rope', 'sinusoidal', 'xpos']
    """
    rows = []
    for name, cls in SCHEMES.items():
        attention = cls.acts_on == "attention"
        instance = cls.build(num_heads, head_dim)
        rows.append(
            {
                "name": name,
                "class": cls.__name__,
                "acts_on": cls.acts_on,
                "hooks": cls.hooks() if attention else ("input",),
                "fused": cls.fused() if attention else False,
                "quadratic_memory": bool(cls.quadratic_memory),
                "parameters": sum(p.numel() for p in instance.parameters() if p.requires_grad),
                "shared_across_layers": bool(cls.shared_across_layers),
                "reference": cls.reference,
            }
        )
    return rows
