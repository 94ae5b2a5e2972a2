"""Helpers for the book's derivations: what a chapter computes beyond a few lines.

Each submodule serves one line of argument; everything public is re-exported
here, so chapters write ``posenc.analysis.sinusoid_decay_integral``.
"""

from .claims import *  # noqa: F403
from .complex_solution import *  # noqa: F403
from .decay import *  # noqa: F403
from .general_h import *  # noqa: F403
from .properties import *  # noqa: F403
from .taylor import *  # noqa: F403
