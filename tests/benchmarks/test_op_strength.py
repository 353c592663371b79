"""benchmarks/op_strength.py on a finished smoke search (a small space: 2 nodes, 4 ops): every edge's ops judged by
the supernet's test accuracy, and the cell DARTS's rule derives from those strengths."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import op_strength
from search_space.errors import UserInputError
from search_space.genotypes import Genotype

REPO = Path(__file__).resolve().parents[2]
PRIMITIVES = ["none", "skip_connect", "max_pool_3x3", "sep_conv_3x3"]


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    run = tmp_path_factory.mktemp("op_strength") / "search"
    searched = subprocess.run(
        [sys.executable, str(REPO / "search.py"), "experiment=smoke", "logger=none", "search_space.steps=2",
         "search_space.multiplier=2", f"search_space.primitives=[{','.join(PRIMITIVES)}]",
         "search.evolution.max_skip_connect=null", f"hydra.run.dir={run}"],  # no cap: DARTS's plain rule
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert searched.returncode == 0, searched.stderr[-2000:]
    printed = subprocess.run([sys.executable, str(REPO / "benchmarks" / "op_strength.py"), "--run", str(run),
                              "--images", "20", "--device", "cpu"], cwd=REPO, capture_output=True, text=True,
                             timeout=300)
    assert printed.returncode == 0, printed.stderr[-2000:]
    return run, json.loads((run / "op_strength.json").read_text()), printed.stdout


def test_each_edge_given_its_alpha_argmax_op_is_the_base_path(judged):
    """Every edge's row holds the base path's accuracy at the op α chose there: the same path, measured again."""
    run, result, _ = judged
    alpha = op_strength.load_supernet(run, (), 20, "cpu")[0].alpha_probabilities()
    assert result["primitives"] == PRIMITIVES and result["images"] == 20
    for kind, table in result["accuracy"].items():
        assert len(table) == 5 and all(len(row) == len(PRIMITIVES) for row in table)  # 2 + 3 edges
        for edge, (row, discordant) in enumerate(zip(table, result["discordant"][kind])):
            argmax = int(alpha[kind][edge].argmax())
            assert row[argmax] == result["base_accuracy"] and discordant[argmax] == 0
            for acc, changed in zip(row, discordant):
                if acc is not None:  # None: an op pruned for good
                    assert 0.0 <= acc <= 1.0 and 20 >= changed >= round(abs(acc - result["base_accuracy"]) * 20)
    assert len({acc for table in result["accuracy"].values() for row in table for acc in row}) > 2


def test_the_strength_cell_is_darts_rule_on_accuracy_gains_over_the_cut_edge(judged):
    """Per node the two edges whose strongest op gains most over cutting the edge, each with that op; the α cell is
    the search's own genotype.json."""
    run, result, stdout = judged
    none = PRIMITIVES.index("none")
    inputs = [0, 1, 0, 1, 2]  # the input state of each edge: node 0 reads states 0, 1; node 1 reads 0, 1, 2
    expected = []
    for node_edges in ((0, 1), (2, 3, 4)):
        table = result["accuracy"]["normal"]
        best = {edge: max((op for op in range(len(PRIMITIVES)) if op != none and table[edge][op] is not None),
                          key=lambda op: table[edge][op]) for edge in node_edges}
        gain = {edge: table[edge][best[edge]] - table[edge][none] for edge in node_edges}
        kept = sorted(node_edges, key=lambda edge: -gain[edge])[:2]
        expected += [[PRIMITIVES[best[edge]], inputs[edge]] for edge in kept]
    assert result["strength_genotype"]["normal"] == expected
    assert Genotype.from_json(json.dumps(result["alpha_genotype"])) == Genotype.from_json(
        (run / "genotype.json").read_text())
    assert "base path" in stdout and "strength_genotype: parameter-free edges" in stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--images", "0"], "--images 0: need at least 1"),
    (["seed=3"], "only data.root and data.num_workers may change"),
])
def test_bad_input_is_refused_in_one_line(judged, capsys, args, message):
    run, _, _ = judged
    assert op_strength.main(["--run", str(run), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_a_run_without_its_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    assert op_strength.main(["--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no checkpoints/last.pt; pass a search run dir that kept its checkpoint" in err and "\n" not in err


def test_a_device_whose_base_path_disagrees_with_the_cpu_is_refused(judged):
    """check_against_cpu: the same checkpoint twice agrees fully; a copy that computes something else (here its
    classifier negated, standing in for a device fault) is refused with the fix named."""
    run, _, _ = judged
    supernet, _, test = op_strength.load_supernet(run, (), 20, "cpu")
    batch = next(iter(test))[:2]
    same = op_strength.load_supernet(run, (), 20, "cpu")[0]
    assert op_strength.check_against_cpu(supernet, same, batch) == 1.0
    with torch.no_grad():
        same.classifier.weight.neg_()
        same.classifier.bias.neg_()
    with pytest.raises(UserInputError, match="a device fault, not a result; run with --device cpu"):
        op_strength.check_against_cpu(supernet, same, batch, min_agreement=1.0)
