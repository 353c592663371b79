"""benchmarks/rank_correlation.py: Kendall's τ-b by hand and against scipy, the pairing of two summaries by
genotype, and its one-line errors."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import rank_correlation as rc
from search_space.genotypes import GENOTYPES, random_genotype
from search_space.ops import PRIMITIVE_SETS

REPO = Path(__file__).resolve().parents[2]
CELLS = [random_genotype(PRIMITIVE_SETS["darts"], 4, random.Random(seed), 2) for seed in range(3)]


@pytest.mark.parametrize("y, tau", [
    ([1, 2, 3, 4], 1.0), ([4, 3, 2, 1], -1.0), ([2, 1, 3, 4], 2 / 3),  # one swap of 4: (5 - 1) / 6
    ([1, 1, 1, 1], None),
])
def test_kendall_tau_b_by_hand(y, tau):
    result = rc.kendall_tau_b([1, 2, 3, 4], y)
    assert result == (None if tau is None else pytest.approx(tau))


def test_kendall_tau_b_matches_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    for _ in range(20):
        x = [rng.randint(0, 3) for _ in range(9)]
        y = [rng.randint(0, 3) for _ in range(9)]
        assert rc.kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y).statistic)


def _summary(path: Path, cells: dict[str, tuple[str, object, list[float]]]) -> Path:
    """A hand-made summary: {source: (arm, genotype, test accuracies of its retrain seeds)}."""
    summary: dict[str, list] = {arm: [] for arm in rc.ARMS}
    for source, (arm, genotype, accuracies) in cells.items():
        summary[arm] += [{"source": source, "genotype": json.loads(genotype.to_json()), "test_acc": acc}
                         for acc in accuracies]
    path.write_text(json.dumps(summary))
    return path


def test_summaries_pair_by_genotype_not_by_name(tmp_path, capsys):
    proxy = _summary(tmp_path / "proxy.json", {
        "search_0": ("searched", CELLS[0], [0.50, 0.60]),  # mean 0.55
        "random_0": ("random", CELLS[1], [0.40]), "random_1": ("random", CELLS[2], [0.45]),
        "DARTS_V2": ("reference", GENOTYPES["DARTS_V2"], [0.70]),
        "POOR_POOL_SKIP": ("poor", GENOTYPES["POOR_POOL_SKIP"], [0.20]),  # only here: left out
    })
    full = _summary(tmp_path / "full.json", {
        "search_2": ("searched", CELLS[0], [0.90]),  # another name, the same cell: paired
        "random_0": ("random", CELLS[1], [0.85]), "random_1": ("random", CELLS[2], [0.80]),  # swapped
        "DARTS_V2": ("reference", GENOTYPES["DARTS_V2"], [0.95]),
        "search_1": ("searched", GENOTYPES["PC_DARTS"], [0.99]),  # only here: left out
    })
    result = rc.correlate(rc.read_cells(proxy), rc.read_cells(full))
    assert len(result.pairs) == 4 and result.tau == pytest.approx(2 / 3)
    assert [p.names for p, _ in result.pairs] == [("search_0",), ("random_0",), ("random_1",), ("DARTS_V2",)]
    assert result.pairs[0][0].mean == pytest.approx(0.55)
    assert rc.main(["--proxy", str(proxy), "--full", str(full)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Kendall τ-b = 0.667 over 4 cells in common")
    assert lines[3] == "| search_0 = search_2 | searched | 0.5500 | 0.9000 | 2 | 2 |" and len(lines) == 7


def test_ranks_share_ties():
    assert rc.ranks([0.5, 0.9, 0.5, 0.1]) == [2.5, 1, 2.5, 4]


@pytest.mark.parametrize("case, message", [
    ("missing", "no such file"), ("not json", "not a readable JSON summary"), ("empty", "no retrained cell"),
    ("disjoint", "0 cell(s) in common"),
])
def test_bad_input_is_one_line(tmp_path, case, message, capsys):
    """In-process (main's return code); the first case also as the script, for its exit status."""
    proxy = _summary(tmp_path / "proxy.json", {"random_0": ("random", CELLS[0], [0.4]),
                                               "random_1": ("random", CELLS[1], [0.5])})
    full = tmp_path / "full.json"
    if case == "not json":
        full.write_text("{")
    elif case == "empty":
        full.write_text(json.dumps({"searched": [], "budget": {}}))
    elif case == "disjoint":
        _summary(full, {"DARTS_V2": ("reference", GENOTYPES["DARTS_V2"], [0.9])})
    args = ["--proxy", str(proxy), "--full", str(full)]
    if case == "missing":
        done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "rank_correlation.py"), *args], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    else:
        code = rc.main(args)
        stdout, stderr = capsys.readouterr()
    assert code == 2 and stdout == ""
    assert stderr.startswith("rank_correlation: ") and message in stderr
    assert len(stderr.strip().splitlines()) == 1
