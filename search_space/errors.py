"""The one exception type for bad user input (configs, genotype files, data, checkpoints).

Its message is a single line that names the problem and the fix. The entry points print it
without a traceback and exit non-zero; anything else is a bug and keeps its traceback.
It lives in the lowest layer that the packages above share (search_space ← aso_se ← apps).
"""


class UserInputError(ValueError):
    """Bad input from the user; the message says what was expected and how to fix it."""
