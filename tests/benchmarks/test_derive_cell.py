"""search.py writes each cycle's α; benchmarks/derive_cell.py derives the search's cell again from it under other caps
(a smoke search in a small space with pools and a skip, so that a cap has edges to act on)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import derive_cell
from search_space.genotypes import Genotype

REPO = Path(__file__).resolve().parents[2]
PRIMITIVES = ["none", "skip_connect", "max_pool_3x3", "avg_pool_3x3", "sep_conv_3x3"]
FREE = {"skip_connect", "max_pool_3x3", "avg_pool_3x3"}
POOLS = {"max_pool_3x3", "avg_pool_3x3"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("derive_cell") / "search"
    searched = subprocess.run(
        [sys.executable, str(REPO / "search.py"), "experiment=smoke", "logger=none", "search_space.steps=2",
         "search_space.multiplier=2", f"search_space.primitives=[{','.join(PRIMITIVES)}]",
         "search.evolution.max_skip_connect=null", f"hydra.run.dir={run}"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert searched.returncode == 0, searched.stderr[-2000:]
    return run


def derive_main(*args: str) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "derive_cell.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def test_each_cycle_writes_the_alpha_its_genotype_was_derived_from(run: Path) -> None:
    cycles = sorted(path.name for path in (run / "alphas").iterdir())
    assert cycles == sorted(path.name for path in (run / "genotypes").iterdir())
    for name in cycles:
        alpha = json.loads((run / "alphas" / name).read_text())
        assert alpha["primitives"] == PRIMITIVES and (alpha["steps"], alpha["multiplier"]) == (2, 2)
        for kind in ("normal", "reduce"):
            assert len(alpha[kind]) == 5 and all(abs(sum(row) - 1) < 1e-5 for row in alpha[kind])
        genotype = Genotype.from_json((run / "genotypes" / name).read_text())
        assert derive_cell.derive(alpha, max_skip_connect=None, max_parameter_free=None) == genotype
    assert len({json.dumps(json.loads((run / "alphas" / n).read_text())["normal"]) for n in cycles}) == len(cycles)


def test_a_cap_of_zero_leaves_no_pool_or_skip_and_the_run_caps_give_its_genotype(run: Path, tmp_path: Path) -> None:
    searched = Genotype.from_json((run / "genotype.json").read_text())
    code, stdout, stderr = derive_main("--run", str(run), "--out", str(tmp_path / "same.json"))
    assert code == 0, stderr
    assert Genotype.from_json((tmp_path / "same.json").read_text()) == searched
    code, stdout, stderr = derive_main("--run", str(run), "--max-parameter-free", "0", "--out",
                                       str(tmp_path / "capped.json"))
    assert code == 0, stderr
    capped = Genotype.from_json((tmp_path / "capped.json").read_text())
    assert all(op == "sep_conv_3x3" for kind in ("normal", "reduce") for op, _ in getattr(capped, kind))
    assert "'max_parameter_free': 0" in stdout and "{'normal': 0, 'reduce': 0}" in stdout
    assert sum(op in FREE for op, _ in searched.normal + searched.reduce) > 0  # the cap had something to do


def test_a_normal_pool_cap_of_zero_leaves_the_reduction_cell_as_searched(run: Path, tmp_path: Path) -> None:
    searched = Genotype.from_json((run / "genotype.json").read_text())
    code, stdout, stderr = derive_main("--run", str(run), "--max-normal-pools", "0", "--out", str(tmp_path / "np.json"))
    assert code == 0, stderr
    capped = Genotype.from_json((tmp_path / "np.json").read_text())
    assert not any(op in POOLS for op, _ in capped.normal) and capped.reduce == searched.reduce
    assert any(op in POOLS for op, _ in searched.normal)  # the cap had something to do
    assert "'max_normal_pools': 0" in stdout


def test_a_run_without_alpha_files_is_read_from_its_checkpoint(run: Path, tmp_path: Path) -> None:
    old = tmp_path / "old_run"
    shutil.copytree(run, old, ignore=shutil.ignore_patterns("alphas", "tb"))
    from_checkpoint, _ = derive_cell.final_alpha(old)
    from_file, _ = derive_cell.final_alpha(run)
    assert from_checkpoint["primitives"] == from_file["primitives"]
    for kind in ("normal", "reduce"):
        for row_a, row_b in zip(from_checkpoint[kind], from_file[kind]):
            assert row_a == pytest.approx(row_b, abs=1e-6)


def test_bad_input_is_one_line_and_writes_nothing(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "kept.json"
    out.write_text("mine")
    code, _, stderr = derive_main("--run", str(run), "--out", str(out))
    assert code == 2 and stderr.startswith("derive_cell: --out") and out.read_text() == "mine"
    code, _, stderr = derive_main("--run", str(tmp_path), "--out", str(tmp_path / "x.json"))
    assert code == 2 and "neither alphas/cycle_<k>.json nor checkpoints/last.pt" in stderr
    code, _, stderr = derive_main("--run", str(run), "--max-parameter-free", "-1", "--out", str(tmp_path / "y.json"))
    assert code == 2 and "a count of edges" in stderr and not (tmp_path / "y.json").exists()
