"""benchmarks/graph_ops_equality.py on a CPU (no graphs): the comparisons find two eager engines equal."""
from __future__ import annotations

import pytest
import torch

from benchmarks import graph_ops_equality as script


@pytest.mark.slow  # CI keeps the difference measure's test; the GPU run is the real one
def test_lockstep_of_two_eager_engines_finds_no_difference_and_runs_each_step():
    batch = script.digits()
    rows = script.lockstep("relu", 1, False, batch, "cpu", steps=2)
    assert [row[0] for row in rows] == [0, 1]
    assert all(row[1] == 0 and row[2] == 0 and row[3] == 0 for row in rows)
    assert script.free_run("relu", 1, False, batch, "cpu", steps=2) == [0.0, 0.0]


def test_relative_difference_is_scaled_by_the_reference():
    assert script.relative(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 2.0])) == 0.5
