"""benchmarks/cell_features.py: the features by hand, τ-b against the readable reference, p, and the script."""
from __future__ import annotations

import json
import random

import pytest
import torch
from omegaconf import OmegaConf

from benchmarks import cell_features as cf
from benchmarks.common import compose_config
from benchmarks.rank_correlation import kendall_tau_b
from search_space.genotypes import GENOTYPES, Genotype, load_genotype


def test_features_of_darts_v2_by_hand():
    darts_v2 = GENOTYPES["DARTS_V2"]
    features = cf.cell_features(darts_v2, ["sep_conv_3x3", "skip_connect", "dil_conv_3x3", "max_pool_3x3"])
    assert features["normal sep_conv_3x3"] == 5 and features["normal skip_connect"] == 2
    assert features["normal dil_conv_3x3"] == 1 and features["normal max_pool_3x3"] == 0
    assert features["normal 5x5 kernels"] == 0 and features["normal parameter-free"] == 2
    assert features["normal depth"] == 2  # node 5 reads node 2, which reads the inputs
    assert features["normal edges from the inputs"] == 7
    assert (features["reduction pools"], features["reduction convs"], features["reduction skips"]) == (5, 0, 3)


def test_depth_of_a_chain_cell_is_its_node_count():
    chain = Genotype(normal=(("sep_conv_5x5", 0), ("skip_connect", 1), ("dil_conv_5x5", 2), ("avg_pool_3x3", 0),
                             ("sep_conv_3x3", 3), ("skip_connect", 1), ("max_pool_3x3", 4), ("skip_connect", 0)),
                     normal_concat=(5,), reduce=GENOTYPES["DARTS_V2"].reduce, reduce_concat=(2, 3, 4, 5))
    assert cf.depth(chain.normal) == 4
    features = cf.cell_features(chain, ["sep_conv_5x5"])
    assert features["normal 5x5 kernels"] == 2 and features["normal edges from the inputs"] == 5


def test_taus_equal_the_reference_with_ties_in_either_ranking():
    rng = random.Random(0)
    for n in (3, 5, 12):
        features = [[rng.randint(0, 3) for _ in range(n)] for _ in range(4)]
        accuracy = [[rng.choice([0.91, 0.92, 0.93, rng.random()]) for _ in range(n)] for _ in range(3)]
        got = cf.taus(torch.tensor(features, dtype=torch.float64), torch.tensor(accuracy, dtype=torch.float64))
        for b, acc in enumerate(accuracy):
            for f, feature in enumerate(features):
                expected = kendall_tau_b(feature, acc)
                if expected is None:
                    assert torch.isnan(got[b, f])
                else:
                    assert got[b, f].item() == pytest.approx(expected)


def _cells(accuracies, genotypes):
    return {f"cell_{k}": {"genotype": json.loads(load_genotype(g).to_json()), "test_acc": a}
            for k, (g, a) in enumerate(zip(genotypes, accuracies))}


def test_a_feature_in_the_accuracy_order_gets_tau_one_and_a_low_p():
    names = ["DARTS_V2", "PC_DARTS", "DARTS_V1", "POOR_POOL_SKIP", "NASNet", "AmoebaNet"]
    cells = _cells([0.9 - 0.01 * k for k in range(len(names))], names)
    analysis = cf.analyse(cells, permutations=2000, seed=1)
    parameter_free = {name: analysis["cells"][name]["normal parameter-free"] for name in cells}
    tau = analysis["features"]["normal parameter-free"]
    assert tau["tau"] == pytest.approx(kendall_tau_b(list(parameter_free.values()),
                                                     [c["test_acc"] for c in cells.values()]))
    for row in analysis["features"].values():
        if row["tau"] is not None:
            assert 0 < row["p"] <= row["p_familywise"] <= 1
    assert cf.analyse(cells, permutations=2000, seed=1) == analysis  # seeded
    chain = {name: {"genotype": cell["genotype"], "test_acc": cell["test_acc"]} for name, cell in cells.items()}
    for k, cell in enumerate(chain.values()):  # reduction convs made to fall with the accuracy: τ = -1
        cell["genotype"]["reduce"] = [["sep_conv_3x3" if e < k + 1 else "max_pool_3x3", i]
                                      for e, (_, i) in enumerate(cell["genotype"]["reduce"])]
    perfect = cf.analyse(chain, permutations=2000, seed=1)["features"]["reduction convs"]
    assert perfect["tau"] == pytest.approx(-1.0) and perfect["p"] < 0.01


def _fake_run(root, name: str, genotype: str, test_acc: float):
    run = root / f"{name}_seed0"
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(compose_config("train", ["experiment=smoke"]), run / ".hydra" / "config.yaml")
    (run / "metrics.json").write_text(json.dumps({"genotype": load_genotype(genotype).to_json(), "test_acc": test_acc,
                                                  "params_m": 0.1, "wall_time_s": 1.0, "cpu_time_s": 1.0,
                                                  "pending": ["snn", "energy"]}))
    return run


def test_the_script_reports_every_feature_and_refuses_bad_input(tmp_path, capsys):
    runs = [_fake_run(tmp_path, name, name, acc)
            for name, acc in (("DARTS_V2", 0.93), ("PC_DARTS", 0.92), ("POOR_POOL_SKIP", 0.80))]
    out = tmp_path / "features.json"
    assert cf.main(["--runs", *map(str, runs), "--permutations", "200", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "over 3 cells (200 random orders, seed 0)" in printed and "| POOR_POOL_SKIP | 80.00 |" in printed
    written = json.loads(out.read_text())
    assert list(written["cells"]) == ["DARTS_V2", "PC_DARTS", "POOR_POOL_SKIP"]
    free = [written["cells"][name]["normal parameter-free"] for name in written["cells"]]
    expected = kendall_tau_b(free, [0.93, 0.92, 0.80])
    assert free[2] == 8 and expected < 0  # POOR_POOL_SKIP: every edge parameter-free, and the lowest
    assert written["features"]["normal parameter-free"]["tau"] == pytest.approx(expected)
    assert cf.main(["--runs", *map(str, runs), "--out", str(out)]) == 2
    assert "exists; pass a new path" in capsys.readouterr().err
    assert cf.main(["--runs", *map(str, runs[:2])]) == 2
    assert capsys.readouterr().err.strip() == "cell_features: got 2 run dir(s); pass 3 or more finished runs"
    (runs[0] / "metrics.json").unlink()
    assert cf.main(["--runs", *map(str, runs)]) == 2
    assert "without writing metrics.json" in capsys.readouterr().err


def test_p_agrees_with_the_exact_permutation_p_for_few_cells():
    from benchmarks.training_free_scores import permutation_p

    names = ["DARTS_V2", "PC_DARTS", "DARTS_V1", "POOR_POOL_SKIP", "NASNet", "AmoebaNet"]
    cells = _cells([0.93, 0.90, 0.92, 0.80, 0.91, 0.89], names)
    analysis = cf.analyse(cells, permutations=20000, seed=2)
    accuracy = [cell["test_acc"] for cell in cells.values()]
    checked = 0
    for feature, row in analysis["features"].items():
        if row["tau"] is None:
            continue
        exact = permutation_p([analysis["cells"][name][feature] for name in cells], accuracy)
        assert row["p"] == pytest.approx(exact, abs=0.015), feature
        checked += 1
    assert checked >= 5


def test_the_familywise_p_is_the_share_of_orders_whose_largest_tau_reaches_each():
    """Four cells: all 24 orders of the accuracies enumerated with the reference τ-b, against the sampled orders."""
    import itertools

    names = ["DARTS_V2", "PC_DARTS", "POOR_POOL_SKIP", "NASNet"]
    cells = _cells([0.93, 0.92, 0.80, 0.90], names)
    analysis = cf.analyse(cells, permutations=20000, seed=3)
    defined = [f for f, row in analysis["features"].items() if row["tau"] is not None]
    values = {f: [analysis["cells"][name][f] for name in cells] for f in defined}
    orders = list(itertools.permutations([c["test_acc"] for c in cells.values()]))
    largest = [max(abs(kendall_tau_b(values[f], list(order)) or 0.0) for f in defined) for order in orders]
    for feature in defined:
        observed = abs(analysis["features"][feature]["tau"])
        exact = sum(m >= observed - 1e-12 for m in largest) / len(orders)
        assert analysis["features"][feature]["p_familywise"] == pytest.approx(exact, abs=0.015), feature
    assert len(defined) >= 3
