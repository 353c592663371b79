"""search.py derive=strength: the final cell from each op's accuracy on α's split (aso_se/search/strength.py)."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from aso_se.run.checkpoint import load_checkpoint, save_checkpoint
from aso_se.run.search_callbacks import STRENGTH_PATHS, SearchCallbacks
from aso_se.search import strength
from aso_se.search.strength import check_rule, decided_edges, mixed_batches
from search_space.errors import UserInputError
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


def test_the_table_keeps_each_edges_lead_and_its_discordant_images(strength_run: Path) -> None:
    """``lead``: the strongest op's accuracy minus the runner-up's; the two paths judge at least lead × images
    images otherwise, and at most all of them."""
    table = json.loads((strength_run / "strength.json").read_text())
    none, images = PRIMITIVES.index("none"), table["images"]
    for kind in ("normal", "reduce"):
        for row, lead, count in zip(table["accuracy"][kind], table["lead"][kind], table["lead_discordant"][kind]):
            judged = sorted((acc for op, acc in enumerate(row) if op != none and acc is not None), reverse=True)
            assert lead == pytest.approx(judged[0] - judged[1])
            assert round(lead * images) <= count <= images
        assert table["decided_edges"][kind] == decided_edges(table)[kind]
        assert 0 <= table["decided_edges"][kind] <= len(table["lead"][kind])


def test_an_edge_is_decided_when_its_lead_is_two_standard_errors() -> None:
    # images 100: 2 SE of a difference with d discordant images is 2 * sqrt(d) / 100
    table = {"images": 100, "lead": {"normal": [0.2, 0.05, None, 0.0], "reduce": [0.1, 0.1]},
             "lead_discordant": {"normal": [20, 25, None, 0], "reduce": [25, 26]}}
    assert decided_edges(table) == {"normal": 1, "reduce": 1}


@pytest.mark.parametrize("images", [None, 1, 25000])
def test_derive_images_may_be_null_for_all_of_the_split(images: int | None) -> None:
    check_rule("strength", images, PRIMITIVES)


@pytest.mark.parametrize("images", [0, -3, True, 2.5])
def test_derive_images_must_be_a_positive_count(images: object) -> None:
    with pytest.raises(UserInputError, match="or null for all of it"):
        check_rule("strength", images, PRIMITIVES)


def test_mixed_batches_keep_every_image_when_uncapped() -> None:
    labels = torch.arange(5).repeat_interleave(5)
    loader = [(labels[i:i + 10].float().view(-1, 1, 1, 1), labels[i:i + 10]) for i in range(0, 25, 10)]
    batches = mixed_batches(loader, 8, seed=0, device="cpu", max_images=None)
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == labels.tolist()


def test_a_stopped_judging_resumes_from_its_judged_paths_to_the_same_table(
        strength_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM while the paths are judged (a scheduler's stop): the run stops after the path in flight with the
    resume line, keeps the paths judged so far, and its resume judges only the rest, to the uninterrupted table."""
    judge, calls = strength.correct, []

    def counted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # mid-judging, past the base path and the first edges' first ops
            os.kill(os.getpid(), signal.SIGTERM)
        return judge(*args, **kwargs)

    monkeypatch.setattr(strength, "correct", counted)
    run = tmp_path / "search"
    code = run_in_process("search", *SMOKE, *SMALL_SPACE, "derive=strength", "derive_images=20",
                          f"hydra.run.dir={run}", cwd=tmp_path)
    stderr = capsys.readouterr().err
    assert code == 128 + signal.SIGTERM and f"continue with: python search.py resume={run}" in stderr
    assert not (run / "strength.json").exists() and not (run / "genotype.json").exists()
    kept = load_checkpoint(run / "checkpoints" / STRENGTH_PATHS, kind="search")
    assert len(kept["paths"]) == 5 and all(v.dtype == torch.bool and v.numel() == 20 for v in kept["paths"].values())
    stopped_at = len(calls)

    code = run_in_process("search", f"resume={run}", cwd=tmp_path)
    assert code == 0, capsys.readouterr().err[-3000:]
    table, straight = (json.loads((r / "strength.json").read_text()) for r in (run, strength_run))
    total = 1 + sum(v is not None for rows in table["accuracy"].values() for row in rows for v in row)
    assert len(calls) - stopped_at == total - 5  # the kept paths were not judged again
    for key in ("accuracy", "discordant", "lead", "lead_discordant", "decided_edges", "strength_genotype"):
        assert table[key] == straight[key], key
    assert (run / "genotype.json").read_text() == (strength_run / "genotype.json").read_text()
    assert table["judging_seconds"] > 0


def test_paths_of_another_judging_are_not_reused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, judging = tmp_path / STRENGTH_PATHS, {"images": 20, "batch_size": 8, "seed": 0, "global_step": 12}
    paths = {"base": torch.tensor([True, False, True])}
    save_checkpoint({"paths": paths, "judging": judging, "seconds": 3.5}, path, kind="search")
    judged, seconds = SearchCallbacks._judged_paths(path, judging)
    assert seconds == 3.5 and list(judged) == ["base"] and torch.equal(judged["base"], paths["base"])
    assert SearchCallbacks._judged_paths(path, {**judging, "images": 30}) == ({}, 0.0)
    assert "judges every path again" in caplog.text
    path.write_bytes(b"cut short")
    assert SearchCallbacks._judged_paths(path, judging) == ({}, 0.0)


def test_op_strength_on_the_alpha_split_repeats_the_searchs_judging(strength_run: Path) -> None:
    """benchmarks/op_strength.py --split arch on the finished search sees the images its judging saw: one table."""
    from benchmarks import op_strength

    assert op_strength.main(["--run", str(strength_run), "--images", "20", "--split", "arch", "--device", "cpu"]) == 0
    again, table = (json.loads((strength_run / name).read_text())
                    for name in ("op_strength_arch.json", "strength.json"))
    assert again["accuracy"] == table["accuracy"] and again["strength_genotype"] == table["strength_genotype"]


def test_the_strength_cell_keeps_the_normal_pool_cap() -> None:
    primitives = ["none", "max_pool_3x3", "skip_connect", "sep_conv_3x3"]
    # every edge: the pool judged best, then the conv, the skip, the cut edge
    table = [[0.50, 0.80, 0.60, 0.70] for _ in range(5)]
    accuracy = {"normal": table, "reduce": table}
    uncapped = strength.strength_genotype(accuracy, primitives, 2, 2, None, None)
    capped = strength.strength_genotype(accuracy, primitives, 2, 2, None, None, max_normal_pools=0)
    assert all(op == "max_pool_3x3" for op, _ in uncapped.normal + uncapped.reduce)
    assert all(op == "sep_conv_3x3" for op, _ in capped.normal) and capped.reduce == uncapped.reduce
