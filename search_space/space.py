"""The configured search space: which ops an edge chooses from, and the cell's shape."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from search_space.errors import UserInputError
from search_space.ops import check_primitives


@dataclass(frozen=True)
class SearchSpace:
    """``primitives``: candidate ops of every edge (names in ``OPS``); ``steps``: intermediate nodes
    per cell; ``multiplier``: how many of the last nodes are concatenated into the cell output
    (DARTS: steps = multiplier = 4)."""

    primitives: Sequence[str]
    steps: int = 4
    multiplier: int = 4

    def __post_init__(self) -> None:
        object.__setattr__(self, "primitives", check_primitives(self.primitives))  # frozen: normalize here
        if not 1 <= self.multiplier <= self.steps:
            raise UserInputError(
                f"search_space has steps={self.steps}, multiplier={self.multiplier}: "
                "need 1 <= multiplier <= steps (the cell concatenates its last `multiplier` nodes)"
            )
