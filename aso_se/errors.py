"""Library errors, one per event. Only aso_se.run maps them to exit codes."""
from __future__ import annotations

from search_space.errors import UserInputError

__all__ = ["TrainingDiverged", "UserInputError"]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or Inf; the message names where and what to lower."""
