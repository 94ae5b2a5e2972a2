"""Helpers for the book's derivations: what a chapter computes beyond a few lines.

Each submodule serves one line of argument; everything public is re-exported
here, so chapters write ``posenc.analysis.sinusoid_decay_integral``.
"""

from .decay import *  # noqa: F403
