# Types of posenc/lab/propositions.py, which stays byte-for-byte as frozen (commit c9ea503):
# its SHA-256 (frozen_hash) is what the confirmation runs were registered under, so
# annotating it in place would change the hash.  mypy reads this stub instead of the module.
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeAlias

from .stats import t_interval as t_interval

__all__ = ["t_interval", "RECALL_EXPERIMENTS", "Proposition", "PROPOSITIONS", "frozen_hash",
           "check", "failures", "format_verdicts"]  # fmt: skip

_Row: TypeAlias = dict[str, Any]
_Results: TypeAlias = Mapping[str, list[_Row]]
_Verdict: TypeAlias = dict[str, Any]

class _Compute(Protocol):
    def __call__(self, results: _Results, seed: int | None, /) -> float | None: ...

ALPHA: float
MARGIN: float
REACH: float
RECALL_EXPERIMENTS: tuple[str, ...]
RECALL_STATED_SCHEMES: tuple[str, ...]

@dataclasses.dataclass(frozen=True)
class Proposition:
    name: str
    claim: str
    statistic: str
    compute: _Compute
    threshold: float = ...
    stated: str | None = ...
    kind: str = ...
    margin: float | None = ...
    experiments: tuple[str, ...] = ...
    @property
    def preset(self) -> str: ...

PROPOSITIONS: tuple[Proposition, ...]

def frozen_hash() -> str: ...
def check(
    results: Mapping[str, Any], propositions: Iterable[Proposition] = ...
) -> list[_Verdict]: ...
def failures(verdicts: Iterable[_Verdict]) -> list[_Verdict]: ...
def format_verdicts(verdicts: Iterable[_Verdict]) -> str: ...

# used by the fourth freeze (recipe_propositions.py) to read rows and apply these rules
def _row(rows: Iterable[_Row], seed: int | None, **keys: Any) -> _Row: ...
def _decide(p: Proposition, values: list[float]) -> dict[str, Any]: ...
