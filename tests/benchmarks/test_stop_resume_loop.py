"""benchmarks/stop_resume_loop.py on mnist5k smoke runs: a stop mid-save, then its resume."""
from __future__ import annotations

import random

import pytest

from benchmarks import stop_resume_loop as loop


@pytest.mark.slow
def test_a_stop_during_a_checkpoint_write_is_graceful_and_resumes_at_its_step(tmp_path):
    # Trial 3 is a retrain signalled the moment a (timed) checkpoint write begins.
    row = loop.trial(3, random.Random(3), work=tmp_path, data_root=None, delays=(5.0, 60.0), stop_timeout_s=120)
    assert row["entry"] == "train" and row["signal"] == "at a save"
    assert row["outcome"] == "graceful", row
    assert row["resume_matches"] is True and row["resume_stop"] == "graceful", row
