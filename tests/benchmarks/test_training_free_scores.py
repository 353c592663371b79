"""benchmarks/training_free_scores.py: the scores by hand, and the script on tiny fake runs of the smoke config."""
from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from benchmarks import training_free_scores as tfs
from benchmarks.common import compose_config
from search_space.genotypes import load_genotype
from search_space.network import build_network
from search_space.neurons import NeuronFactory


def test_agreement_kernel_counts_agreeing_neurons():
    codes = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 1], [0, 0, 0, 0]])
    assert tfs.agreement_kernel(codes).tolist() == [[4, 2, 1], [2, 4, 1], [1, 1, 4]]


def test_permutation_p_is_exact_for_small_n():
    assert tfs.permutation_p([1, 2, 3], [1, 2, 3]) == pytest.approx(2 / 6)  # τ = ±1: 2 of the 3! orders
    assert tfs.permutation_p([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(8 / 24)  # |τ| ≥ 2/3: 8 of 24
    assert tfs.permutation_p([1, 1, 1], [1, 2, 3]) is None  # one ranking all ties: τ undefined


def _tiny(neuron_kind: str = "st_bif_qann") -> tuple[torch.nn.Module, type]:
    neuron = NeuronFactory(kind=neuron_kind, timesteps=1 if neuron_kind == "st_bif_qann" else 2)
    torch.manual_seed(0)
    return build_network("DARTS_V2", neuron=neuron, channels=4, layers=3, num_classes=3), type(neuron())


def test_naswot_tells_distinct_images_from_repeated_ones_and_grad_norm_is_the_gradients_norm():
    network, neuron_type = _tiny()
    images, labels = torch.randn(6, 3, 32, 32), torch.tensor([0, 1, 2, 0, 1, 2])
    scores = tfs.score_network(network, neuron_type, images, labels)
    by_hand = sum(float(p.grad.double().pow(2).sum()) for p in network.parameters() if p.grad is not None) ** 0.5
    assert scores["grad_norm"] == pytest.approx(by_hand) and scores["grad_norm"] > 0
    assert scores["params"] == pytest.approx(sum(p.numel() for p in network.parameters()) / 1e6)
    assert torch.isfinite(torch.tensor(scores["naswot"]))
    repeated = tfs.score_network(network, neuron_type, images[[0, 0, 1, 2, 3, 4]], labels)  # two equal codes
    assert repeated["naswot"] == float("-inf") or repeated["naswot"] < scores["naswot"] - 10


def test_a_multi_step_neuron_is_refused_in_one_line():
    network, neuron_type = _tiny("st_bif")
    with pytest.raises(tfs.UserInputError, match="score one-step networks"):
        tfs.score_network(network, neuron_type, torch.randn(2, 3, 32, 32), torch.tensor([0, 1]))


def _fake_run(root, name: str, genotype: str, test_acc: float):
    run = root / f"{name}_seed0"
    (run / ".hydra").mkdir(parents=True)
    cfg = compose_config("train", ["experiment=smoke", "neuron=st_bif_qann"])
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    (run / "metrics.json").write_text(json.dumps({"genotype": load_genotype(genotype).to_json(), "test_acc": test_acc,
                                                  "params_m": 0.1, "wall_time_s": 1.0, "cpu_time_s": 1.0}))
    return run


def test_the_script_scores_runs_and_extra_cells_and_correlates_the_runs(tmp_path, capsys):
    runs = [_fake_run(tmp_path, "DARTS_V2", "DARTS_V2", 0.9), _fake_run(tmp_path, "PC_DARTS", "PC_DARTS", 0.8)]
    extra = tmp_path / "cells" / "poor.json"
    extra.parent.mkdir()
    extra.write_text(load_genotype("POOR_POOL_SKIP").to_json())
    out = tmp_path / "scores.json"
    args = ["--runs", *map(str, runs), "--cells", str(extra), "--images", "8", "--seeds", "2", "--out", str(out)]
    assert tfs.main(args) == 0
    written = json.loads(out.read_text())
    assert list(written["cells"]) == ["DARTS_V2", "PC_DARTS", "extra:poor"]
    poor = written["cells"]["extra:poor"]
    assert poor["test_acc"] is None and len(poor["scores"]["naswot"]) == 2
    ordered = [written["cells"][name]["mean"]["params"] for name in ("DARTS_V2", "PC_DARTS")]
    assert written["kendall_tau_b"]["params"] == {"tau": 1.0 if ordered[0] > ordered[1] else -1.0, "p": 1.0}
    assert "Kendall τ-b against the full-budget test accuracy over 2 runs" in capsys.readouterr().out
    before = out.read_text()
    assert tfs.main(args) == 2  # nothing is overwritten
    assert capsys.readouterr().err.strip().startswith("training_free_scores: --out") and out.read_text() == before


def test_runs_of_one_name_in_two_benchmark_dirs_are_both_scored(tmp_path):
    """search_0_seed0 of the uncapped and the capped benchmark: two cells, named by their benchmark dir."""
    runs = [_fake_run(tmp_path / bench / "retrain", "search_0", genotype, acc)
            for bench, genotype, acc in (("full", "DARTS_V2", 0.9), ("full_capped", "PC_DARTS", 0.8))]
    cells = tfs.read_cells(runs, [], "extra")
    assert list(cells) == ["full:search_0", "full_capped:search_0"]
    assert [cell["test_acc"] for cell in cells.values()] == [0.9, 0.8]
