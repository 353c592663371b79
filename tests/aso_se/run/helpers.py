"""Shared by the apps tests: where the entry points are, and the smoke overrides."""
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SMOKE = ["experiment=smoke", "logger=none"]
RunApp = Callable[..., tuple[int, str]]  # run_app("search", *overrides) -> (exit code, stderr)
