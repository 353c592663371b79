"""benchmarks/alpha_agreement.py: two searches' α at one cycle's end compared."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import alpha_agreement

PRIMITIVES = ["none", "skip_connect", "sep_conv_3x3"]
# softmax(α) of a 2-node space: 5 edges of [none, skip, conv]
NORMAL = [[0.1, 0.2, 0.7], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4], [0.1, 0.6, 0.3], [0.25, 0.25, 0.5]]
REDUCE = [[0.2, 0.3, 0.5], [0.4, 0.4, 0.2], [0.1, 0.1, 0.8], [0.3, 0.5, 0.2], [0.2, 0.2, 0.6]]
CELL = {"normal": [["sep_conv_3x3", 0], ["skip_connect", 1], ["skip_connect", 1], ["sep_conv_3x3", 2]],
        "normal_concat": [2, 3], "reduce": [["sep_conv_3x3", 0], ["skip_connect", 1], ["sep_conv_3x3", 0],
                                            ["sep_conv_3x3", 2]], "reduce_concat": [2, 3]}


def search_run(root: Path, name: str, normal: list, reduce: list, cell: dict, primitives: list = PRIMITIVES,
               cycle: int = 0) -> Path:
    run = root / name
    (run / "alphas").mkdir(parents=True, exist_ok=True)
    (run / "genotypes").mkdir(exist_ok=True)
    alphas = {"primitives": primitives, "steps": 2, "multiplier": 2, "normal": normal, "reduce": reduce}
    (run / "alphas" / f"cycle_{cycle}.json").write_text(json.dumps(alphas))
    (run / "genotypes" / f"cycle_{cycle}.json").write_text(json.dumps(cell))
    return run


def test_a_run_against_itself_agrees_fully(tmp_path: Path, capsys) -> None:
    run = search_run(tmp_path, "a", NORMAL, REDUCE, CELL)
    assert alpha_agreement.main([str(run), str(run), "--out", str(tmp_path / "same.json")]) == 0
    result = json.loads((tmp_path / "same.json").read_text())
    for cell in ("normal", "reduce"):
        assert result[cell] == {"edges": 5, "same_strongest_op": 5, "mean_total_variation": 0.0, "cells_differ": 0,
                                "cell_edges": 4}
    assert "normal: strongest op the same on 5 of 5 edges, mean total variation 0.000" in capsys.readouterr().out


def test_a_moved_edge_shows_in_every_measure(tmp_path: Path) -> None:
    """Normal edge 0 turns from conv to skip (total variation 0.5 on that edge: 0.1 over 5 edges) and the cell's first
    edge with it; the reduction cell is untouched."""
    normal = [list(edge) for edge in NORMAL]
    normal[0] = [0.1, 0.7, 0.2]
    cell = json.loads(json.dumps(CELL))
    cell["normal"][0] = ["skip_connect", 0]
    a, b = search_run(tmp_path, "a", NORMAL, REDUCE, CELL), search_run(tmp_path, "b", normal, REDUCE, cell)
    assert alpha_agreement.main([str(a), str(b), "--out", str(tmp_path / "moved.json")]) == 0
    result = json.loads((tmp_path / "moved.json").read_text())
    assert result["normal"]["same_strongest_op"] == 4 and result["normal"]["cells_differ"] == 1
    assert result["normal"]["mean_total_variation"] == pytest.approx(0.1)
    assert result["reduce"]["same_strongest_op"] == 5 and result["reduce"]["mean_total_variation"] == 0


def test_runs_of_two_spaces_or_without_the_cycle_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    a = search_run(tmp_path, "a", NORMAL, REDUCE, CELL)
    other = search_run(tmp_path, "b", NORMAL, REDUCE, CELL, primitives=["none", "max_pool_3x3", "sep_conv_3x3"])
    assert alpha_agreement.main([str(a), str(other)]) == 2
    assert "different search spaces" in capsys.readouterr().err
    assert alpha_agreement.main([str(a), str(a), "--cycle", "1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "alphas/cycle_1.json does not exist" in line


def test_one_run_against_itself_one_cycle_later(tmp_path: Path) -> None:
    """--cycle-b: a run's cycle 0 against its cycle 1, where the reduction cell's edge 1 turned from skip to conv."""
    reduce = [list(edge) for edge in REDUCE]
    reduce[1] = [0.1, 0.2, 0.7]
    cell = json.loads(json.dumps(CELL))
    cell["reduce"][1] = ["sep_conv_3x3", 1]
    run = search_run(tmp_path, "a", NORMAL, REDUCE, CELL)
    search_run(tmp_path, "a", NORMAL, reduce, cell, cycle=1)
    out = tmp_path / "cycles.json"
    assert alpha_agreement.main([str(run), str(run), "--cycle", "0", "--cycle-b", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["cycle"], result["cycle_b"]) == (0, 1)
    assert result["normal"]["same_strongest_op"] == 5 and result["normal"]["cells_differ"] == 0
    assert result["reduce"]["same_strongest_op"] == 4 and result["reduce"]["cells_differ"] == 1
    assert result["reduce"]["mean_total_variation"] == pytest.approx(0.5 / 5)
