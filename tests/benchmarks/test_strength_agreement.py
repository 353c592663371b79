"""benchmarks/strength_agreement.py: two op_strength judgings of one supernet compared."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from aso_se.search.strength import strength_genotype
from benchmarks import strength_agreement

PRIMITIVES = ["none", "skip_connect", "sep_conv_3x3"]
ALPHA = {"normal": [["skip_connect", 0], ["skip_connect", 1], ["sep_conv_3x3", 0], ["skip_connect", 2]],
         "normal_concat": [2, 3], "reduce": [["skip_connect", 0], ["skip_connect", 1], ["skip_connect", 0],
                                             ["skip_connect", 1]], "reduce_concat": [2, 3]}


def judged(normal: list[list[float]], reduce: list[list[float]], split: str) -> dict:
    """An op_strength result of a 2-node space (5 edges) whose accuracies are ``[none, skip, conv]`` per edge."""
    accuracy = {"normal": normal, "reduce": reduce}
    cell = strength_genotype(accuracy, PRIMITIVES, steps=2, multiplier=2, max_skip_connect=None,
                             max_parameter_free=None)
    return {"primitives": PRIMITIVES, "accuracy": accuracy, "images": 100, "split": split, "alpha_genotype": ALPHA,
            "strength_genotype": json.loads(cell.to_json())}


NORMAL = [[0.5, 0.6, 0.7], [0.5, 0.55, 0.52], [0.5, 0.51, 0.9], [0.5, 0.8, 0.6], [0.5, 0.58, 0.57]]


def test_one_judging_against_itself_agrees_fully() -> None:
    a = judged(NORMAL, NORMAL, "test")
    result = strength_agreement.agreement(a, a)
    for row in result.values():
        assert row["strength_cells_differ"] == 0 and row["same_strongest_op"] == 5 and row["tau"] == pytest.approx(1)
        assert row["pairs"] == 10 and row["edges"] == 4


def test_a_swapped_edge_shows_in_every_measure(tmp_path: Path, capsys) -> None:
    """Edge 3's strongest op changes and edge 4 gains most: one op differs, node 1 keeps edge 4 instead of edge 3,
    and τ drops below 1."""
    other = [row[:] for row in NORMAL]
    other[3] = [0.5, 0.6, 0.8]
    other[4] = [0.5, 0.95, 0.57]
    a, b = judged(NORMAL, NORMAL, "test"), judged(other, NORMAL, "arch")
    normal = strength_agreement.agreement(a, b)["normal"]
    assert normal["same_strongest_op"] == 4
    # A keeps node 1's edges 2 (conv from 0) and 3 (skip from 1); B keeps 4 (skip from 2) and 2
    assert a["strength_genotype"]["normal"][2:] == [["sep_conv_3x3", 0], ["skip_connect", 1]]
    assert b["strength_genotype"]["normal"][2:] == [["skip_connect", 2], ["sep_conv_3x3", 0]]
    assert normal["strength_cells_differ"] == 1 and normal["tau"] < 1
    for name, result in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps(result))
    assert strength_agreement.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "A: test images, 100; B: arch images, 100" in out and "| normal | 1 of 4 | 4 of 5 |" in out


def test_judgings_of_other_supernets_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    a = judged(NORMAL, NORMAL, "test")
    b = {**a, "alpha_genotype": {**ALPHA, "normal": ALPHA["reduce"]}}
    for name, result in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps(result))
    assert strength_agreement.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert "pass two op_strength files of one search checkpoint" in err and err.count("\n") == 1
