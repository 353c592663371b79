"""benchmarks/sparse_end_to_end.py: the eager arms of a --smoke run end to end, its counting and bad input."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import sparse_end_to_end as bench


@pytest.mark.slow  # CI keeps the script's counting, sparsity and bad-input tests
def test_smoke_run_times_both_eager_arms_and_measures_the_inputs(tmp_path, capsys):
    out = tmp_path / "out"
    # In-process: its retrains are subprocesses anyway; this spares the benchmark's own start-up.
    assert bench.main(["--out", str(out), "--smoke", "--modes", "eager", "--sparsity-batches", "2"]) == 0
    stdout = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    cudnn, dispatcher = summary["runs"]
    assert (cudnn["arm"], dispatcher["arm"]) == ("eager_torch", "eager_auto")
    assert set(cudnn["sparse_conv_paths"]) == {"dense:requested"} and set(dispatcher["sparse_conv_paths"]) == {
        "dense:cpu"}
    assert cudnn["sparse_share"] is None and cudnn["images_per_second_last_epoch"] > 0
    overrides = (out / "train" / "eager_torch" / ".hydra" / "overrides.yaml").read_text()
    assert "model.network.conv_backend=torch" in overrides and "genotype=DARTS_V2" in overrides
    sparsity = summary["activation_sparsity"]
    assert sparsity["convs"] == len(sparsity["per_conv"]) > 0
    assert 0 < sparsity["zero_blocks_mean"] <= sparsity["zero_elements_mean"] < 1  # a block is zero only if all are
    assert stdout.strip().splitlines()[-1].startswith("| eager | dispatcher |")


def test_sparse_share_counts_only_calls_that_could_go_sparse():
    assert bench.sparse_share({"sparse": 3, "dense:too_dense": 1, "dense:eager": 50, "sparse_wgrad": 3}) == 0.75
    assert bench.sparse_share({"dense:eager": 5, "probe": 1}) is None


def test_block_sparsity_of_a_hand_made_input():
    x = torch.zeros(2, 3, 16, 12)  # per plane: 2 x 2 blocks of 8 x 8 (the last ones 8 x 4)
    x[0, 0, 0, 0] = 1.0  # one element makes its block active
    x[1, 2, 15, 11] = -1.0  # a signed spike in a partial block counts too
    zeros, blocks = bench.block_sparsity(x)
    assert zeros == pytest.approx(1 - 2 / x.numel()) and blocks == pytest.approx(1 - 2 / 24)


def test_bad_input_is_one_line(tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert bench.main(["--out", str(tmp_path / "full"), "--smoke", "--modes", "eager"]) == 2
    assert capsys.readouterr().err.strip() == (f"sparse_end_to_end: --out {tmp_path / 'full'} is not empty; "
                                               "pass a new directory or --resume")
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", str(tmp_path / "o"), "--modes", "fast"])
    assert bench.main(["--out", str(tmp_path / "o"), "--smoke", "--modes", "eager", "cuda_graph=true"]) == 2
    assert "sets cuda_graph, which the benchmark sets for every run; drop it (steps: --modes" in capsys.readouterr().err


def test_a_genotype_of_the_users_is_planned_for_every_arm(tmp_path):
    overrides = bench.check_overrides(["genotype=DARTS_V2_SPIKE_NATIVE", "seed=3"], bench.RESERVED_KEYS)
    sweeps = bench.plan_sweeps(tmp_path, overrides, ["eager", "graphed"])
    assert all("genotype=DARTS_V2_SPIKE_NATIVE" in sweep.overrides and "seed=3" in sweep.overrides
               for sweep in sweeps)
