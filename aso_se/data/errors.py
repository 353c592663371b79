"""The data layer's user-error type, and the argument checks the constructors share."""
from search_space.errors import UserInputError

# The usual way out when a dataset is not where the config points.
FIX_ROOT = "set data.root or ASO_SE_DATA, or use data=mnist5k"


class DataError(UserInputError):
    """Missing or malformed data: one line naming the path, what was expected and the fix.

    A DataLoader worker's error is re-created in the main process from torch's multi-line report
    (``"Caught DataError in DataLoader worker ... DataError: <message>"``); the constructor keeps only
    ``<message>``, so the user sees one line with or without workers. Line breaks fold into spaces.
    """

    def __init__(self, message: str) -> None:
        message = message.rstrip().rpartition(f"{__name__}.DataError: ")[2]
        super().__init__(" ".join(message.split()))


def check_positive(value: int | None, key: str, *, allow_zero: bool = False, allow_none: bool = False) -> None:
    """``key`` (as the user spells it, e.g. ``data.num_workers``) must be an integer >= 1
    (>= 0 with ``allow_zero``; or None with ``allow_none``)."""
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if allow_zero else 1):
        expected = "an integer >= 0" if allow_zero else "an integer >= 1"
        raise DataError(f"{key}={value!r} is invalid; expected {expected}{' or null' if allow_none else ''}")


def check_fraction(value: float, key: str) -> None:
    """``key`` must be a number strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise DataError(f"{key}={value!r} is invalid; expected a number between 0 and 1, e.g. 0.2")
