"""Library errors, one per event. Only aso_se.run maps them to exit codes.

Bad user input is ``search_space.errors.UserInputError`` (the lowest layer's; import it from there
only, so that every module names one path for it).
"""
from __future__ import annotations

__all__ = ["TrainingDiverged"]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or Inf; the message names where and what to lower."""
