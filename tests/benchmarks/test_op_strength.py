"""benchmarks/op_strength.py on a finished smoke search (a small space: 2 nodes, 4 ops): every edge's ops judged by
the supernet's test accuracy, and the cell DARTS's rule derives from those strengths."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import op_strength
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
    printed = io.StringIO()  # in-process: spares a start-up (test_benchmark_scripts runs each script as one)
    with contextlib.redirect_stdout(printed):
        assert op_strength.main(["--run", str(run), "--images", "20", "--device", "cpu"]) == 0
    return run, json.loads((run / "op_strength.json").read_text()), printed.getvalue()


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


def test_alpha_split_judges_as_search_derive_strength_does(judged, capsys):
    """--split arch: the images of α's split (training transforms), not the test set's; a file of its own."""
    run, tested, _ = judged
    assert op_strength.main(["--run", str(run), "--images", "20", "--split", "arch", "--device", "cpu"]) == 0
    result = json.loads((run / "op_strength_arch.json").read_text())
    assert result["split"] == "arch" and result["images"] == 20 and tested["split"] == "test"
    assert "accuracy on α's split" in capsys.readouterr().out
    assert result["alpha_genotype"] == tested["alpha_genotype"]  # one supernet, judged on other images
    supernet, cfg, loader = op_strength.load_supernet(run, (), 20, "cpu", split="arch")
    batches = op_strength.mixed_batches(loader, cfg.batch_size, cfg.seed, "cpu", max_images=20)
    assert op_strength.strengths(supernet, batches)["accuracy"] == result["accuracy"]  # the same images again


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


def test_batches_mix_the_classes_of_a_class_sorted_test_set():
    """Batch norms run on the batch's statistics, so a batch of one class would judge every path wrongly."""
    labels = torch.arange(10).repeat_interleave(40)  # sorted by class, as ImageFolder reads CIFAR-10
    images = labels.float().view(-1, 1, 1, 1).expand(-1, 1, 2, 2).clone()
    loader = [(images[i:i + 64], labels[i:i + 64]) for i in range(0, 400, 64)]
    batches = op_strength.mixed_batches(loader, 50, seed=0, device="cpu")
    assert [len(y) for _, y in batches] == [50] * 8
    assert min(len(set(y.tolist())) for _, y in batches) >= 8
    assert all(torch.equal(x[:, 0, 0, 0].long(), y) for x, y in batches)  # images stay with their labels
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == labels.tolist()
    again = op_strength.mixed_batches(loader, 50, seed=0, device="cpu")
    assert all(torch.equal(y, y2) for (_, y), (_, y2) in zip(batches, again))  # one fixed order
