"""search.py derive=strength: the final cell from each op's accuracy on α's split (aso_se/search/strength.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aso_se.search.strength import mixed_batches
from search_space.genotypes import Genotype
from tests.aso_se.run.helpers import SMOKE, run_in_process

PRIMITIVES = ["none", "skip_connect", "max_pool_3x3", "sep_conv_3x3"]
SMALL_SPACE = ["search_space.steps=2", "search_space.multiplier=2",
               f"search_space.primitives=[{','.join(PRIMITIVES)}]", "search.evolution.max_skip_connect=null"]


@pytest.fixture(scope="module")
def strength_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("strength") / "search"
    code = run_in_process("search", *SMOKE, *SMALL_SPACE, "derive=strength", "derive_images=20",
                          f"hydra.run.dir={run}", cwd=run.parent)
    assert code == 0
    return run


def test_the_final_cell_is_darts_rule_on_the_strengths_of_the_written_table(strength_run: Path) -> None:
    """Per node the two edges whose strongest op gains most over the cut edge, each with that op."""
    table = json.loads((strength_run / "strength.json").read_text())
    assert table["images"] == 20 and table["primitives"] == PRIMITIVES
    none = PRIMITIVES.index("none")
    inputs = [0, 1, 0, 1, 2]  # the input state of each edge: node 0 reads states 0, 1; node 1 reads 0, 1, 2
    written = Genotype.from_json((strength_run / "genotype.json").read_text())
    for kind in ("normal", "reduce"):
        accuracy, expected = table["accuracy"][kind], []
        for node_edges in ((0, 1), (2, 3, 4)):
            best = {edge: max((op for op in range(len(PRIMITIVES)) if op != none and accuracy[edge][op] is not None),
                              key=lambda op: accuracy[edge][op]) for edge in node_edges}
            gain = {edge: accuracy[edge][best[edge]] - accuracy[edge][none] for edge in node_edges}
            kept = sorted(node_edges, key=lambda edge: -gain[edge])[:2]
            expected += [(PRIMITIVES[best[edge]], inputs[edge]) for edge in kept]
        assert list(getattr(written, kind)) == expected
    assert json.loads(written.to_json()) == table["strength_genotype"]


def test_the_alpha_cell_stays_beside_it(strength_run: Path) -> None:
    """The α cell in strength.json is the last cycle's; search_metrics.json names the rule that chose genotype.json."""
    table = json.loads((strength_run / "strength.json").read_text())
    (last_cycle,) = sorted((strength_run / "genotypes").glob("cycle_*.json"))[-1:]
    assert Genotype.from_json(json.dumps(table["alpha_genotype"])) == Genotype.from_json(last_cycle.read_text())
    assert json.loads((strength_run / "search_metrics.json").read_text())["derive"] == "strength"
    accuracies = [acc for rows in table["accuracy"].values() for row in rows for acc in row if acc is not None]
    assert len(set(accuracies)) > 2 and all(0.0 <= acc <= 1.0 for acc in accuracies)  # paths judged apart


def test_mixed_batches_keep_the_first_images_of_the_loader_when_capped() -> None:
    labels = torch.arange(10).repeat_interleave(7)
    images = labels.float().view(-1, 1, 1, 1).expand(-1, 1, 2, 2).clone()
    loader = [(images[i:i + 16], labels[i:i + 16]) for i in range(0, 70, 16)]
    batches = mixed_batches(loader, 8, seed=1, device="cpu", max_images=30)
    assert [len(y) for _, y in batches] == [8, 8, 8, 6]
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == sorted(labels[:30].tolist())
    assert all(torch.equal(x[:, 0, 0, 0].long(), y) for x, y in batches)
