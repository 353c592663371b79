"""benchmarks/search_vs_random.py: the --smoke benchmark end to end (one search; its retrains are one
multirun whose last job equals a direct train.py run), its statistics and α entropy, its plan, and that the
random cells are ones the search's derivation could have produced (the parts it shares with the other
benchmarks: test_common.py)."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aso_se.search.derive import derive_genotype
from benchmarks import search_vs_random as bench
from benchmarks.search_vs_random import ArmStats
from search_space.genotypes import GENOTYPES, Genotype, random_genotype
from search_space.ops import PARAMETER_FREE_OPS, POOL_OPS, PRIMITIVE_SETS

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "search_vs_random.py"
DARTS = PRIMITIVE_SETS["darts"]


def run_benchmark(*args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The --smoke benchmark (one search, two random cells) and its stdout; run in-process (its multiruns are
    subprocesses anyway), which spares the benchmark's own start-up. test_a_failed_run_stops_the_benchmark_with_one_line
    runs it as a script."""
    out = tmp_path_factory.mktemp("bench") / "out dir"  # a space: the run paths must reach Hydra quoted
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert bench.main(["--out", str(out), "--smoke", "--searches", "1"]) == 0
    return out, stdout.getvalue()


def _genotype(value: object) -> Genotype:
    return Genotype.from_json(json.dumps(value))


def test_smoke_summary_has_every_arm_and_its_runs(smoke):
    out, _ = smoke
    summary = json.loads((out / "summary.json").read_text())
    assert {*bench.ARMS, "budget", "searches", "minutes", "stats", "verdict"} <= set(summary)
    assert [len(summary[arm]) for arm in bench.ARMS] == [1, 2, 2, 1]
    for arm in bench.ARMS:
        for run in summary[arm]:
            metrics = json.loads((Path(run["run_dir"]) / "metrics.json").read_text())
            assert run["test_acc"] == metrics["test_acc"] and 0.0 <= run["test_acc"] <= 1.0
            assert run["params_m"] == metrics["params_m"] > 0 and 0.0 < run["firing_rate_mean"] < 1.0
            assert _genotype(run["genotype"]) == Genotype.from_json(metrics["genotype"])
            assert run["seed"] == 0 and run["wall_minutes"] > 0 and run["cpu_minutes"] > 0
    references = [_genotype(run["genotype"]) for run in summary["reference"]]
    assert references == [GENOTYPES["DARTS_V2"], GENOTYPES["PC_DARTS"]]
    assert _genotype(summary["poor"][0]["genotype"]) == GENOTYPES["POOR_POOL_SKIP"]
    # The random cells are the seeded draws from the search's space (DARTS's ops, 4 nodes, at most 2 skips).
    expected = [random_genotype(DARTS, 4, random.Random(seed), 2) for seed in (0, 1)]
    assert [_genotype(run["genotype"]) for run in summary["random"]] == expected
    for search, run in zip(summary["searches"], summary["searched"]):
        found = Genotype.from_json((Path(search["run_dir"]) / "genotype.json").read_text())
        assert _genotype(search["genotype"]) == _genotype(run["genotype"]) == found
        assert _genotype(search["cycle_genotypes"][-1]) == found and len(search["cycle_genotypes"]) == 2
        assert run["source"] == f"search_{search['seed']}" and run["alpha_entropy"] == search["alpha_entropy"]["mean"]
        assert Path(search["run_dir"]) == out / "search" / "search_0"
        assert search["wall_minutes"] > 0 and search["cpu_minutes"] > 0  # what the run measured (last.pt)
    assert Path(summary["random"][1]["run_dir"]) == out / "retrain" / "random_1_seed0"


def test_a_job_of_the_retrain_multirun_equals_a_direct_train_run(smoke, tmp_path):
    """The basic launcher runs a multirun's jobs one after another in one process: the last one must not
    differ from the same run on its own (what the old runner did, a process per run)."""
    out, stdout = smoke
    retrain = out / "retrain"
    command = next(line for line in stdout.splitlines() if line.startswith("$ python train.py -m"))
    # printed, to rerun or extend by hand
    subdir = "\"hydra.sweep.subdir='\\${aso_se.stem:\\${genotype}}_seed0'\""
    assert command.endswith(f"\"hydra.sweep.dir='{retrain}'\" {subdir}")
    assert "/genotypes/POOR_POOL_SKIP.json'\"" in command
    direct = subprocess.run([sys.executable, str(REPO / "train.py"), "experiment=smoke", "logger=none",
                             "genotype=POOR_POOL_SKIP", "seed=0", f"hydra.run.dir={tmp_path / 'direct'}"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert direct.returncode == 0, direct.stderr[-2000:]
    swept = json.loads((retrain / "POOR_POOL_SKIP_seed0" / "metrics.json").read_text())
    alone = json.loads((tmp_path / "direct" / "metrics.json").read_text())
    assert swept["test_acc"] == alone["test_acc"] and swept["genotype"] == alone["genotype"]
    assert [epoch["train_loss"] for epoch in swept["history"]] == [epoch["train_loss"] for epoch in alone["history"]]


def test_a_search_run_dir_without_its_checkpoints_is_read_alike(smoke, tmp_path):
    """What the benchmark read of a finished search is kept beside its genotype.json, so its small files alone (no
    checkpoints/, as carried to another machine) give the same record; a mismatched one is refused."""
    out, _ = smoke
    summary = json.loads((out / "summary.json").read_text())
    carried = tmp_path / "search_0"
    shutil.copytree(out / "search" / "search_0", carried, ignore=shutil.ignore_patterns("checkpoints", "tb"))
    rules = bench.search_space_rules(bench.make_plan(bench.parse_args(["--out", str(tmp_path), "--smoke"])))
    assert bench.collect_search(carried, rules) == {**summary["searches"][0], "run_dir": str(carried)}
    stale = json.loads((carried / bench.SEARCH_SUMMARY).read_text())
    stale["genotype"] = json.loads(GENOTYPES["DARTS_V2"].to_json())
    (carried / bench.SEARCH_SUMMARY).write_text(json.dumps(stale))
    with pytest.raises(bench.BenchmarkError, match="names another genotype"):
        bench.collect_search(carried, rules)


def test_a_search_is_read_from_what_it_wrote_as_it_finished_as_from_its_checkpoint(smoke, tmp_path):
    """search_metrics.json (written by the run) gives the record its checkpoint gives, so a run dir carried without
    checkpoints/ and never read by the benchmark is still read; an older run without it is read from last.pt."""
    out, _ = smoke
    rules = bench.search_space_rules(bench.make_plan(bench.parse_args(["--out", str(tmp_path), "--smoke"])))
    small = tmp_path / "small"
    shutil.copytree(out / "search" / "search_0", small,
                    ignore=shutil.ignore_patterns("checkpoints", "tb", bench.SEARCH_SUMMARY))
    older = tmp_path / "older"
    shutil.copytree(out / "search" / "search_0", older,
                    ignore=shutil.ignore_patterns("search_metrics.json", bench.SEARCH_SUMMARY))
    written, from_checkpoint = bench.collect_search(small, rules), bench.collect_search(older, rules)
    assert written["genotype"] == from_checkpoint["genotype"] and written["seed"] == from_checkpoint["seed"]
    assert written["cycle_genotypes"] == from_checkpoint["cycle_genotypes"]
    for kind in ("normal", "reduce", "mean"):
        assert 0 < written["alpha_entropy"][kind] == pytest.approx(from_checkpoint["alpha_entropy"][kind], rel=1e-5)
    # the checkpoint is saved just before the run writes search_metrics.json
    assert 0 < from_checkpoint["wall_minutes"] <= written["wall_minutes"] < from_checkpoint["wall_minutes"] + 0.5
    metrics = json.loads((small / "search_metrics.json").read_text())
    metrics["genotype"] = json.loads(GENOTYPES["DARTS_V2"].to_json())
    (small / "search_metrics.json").write_text(json.dumps(metrics))
    (small / bench.SEARCH_SUMMARY).unlink()
    with pytest.raises(bench.BenchmarkError, match="names another genotype"):
        bench.collect_search(small, rules)


def test_searches_only_stops_before_the_retrains_on_a_carried_dir(smoke, tmp_path, capsys):
    """--searches-only: the searches (here finished, carried without checkpoints) and every cell's genotype file, no
    retrain; a later --resume goes on from there."""
    out = tmp_path / "carried"
    shutil.copytree(smoke[0], out, ignore=shutil.ignore_patterns("checkpoints", "tb", "retrain", "summary.*"))
    shutil.rmtree(out / "genotypes")
    assert bench.main(["--out", str(out), "--smoke", "--searches", "1", "--resume", "--searches-only"]) == 0
    assert "searches done" in capsys.readouterr().out and not (out / "retrain").exists()
    assert sorted(path.stem for path in (out / "genotypes").glob("*.json")) == sorted(
        ["search_0", "random_0", "random_1", "DARTS_V2", "PC_DARTS", "POOR_POOL_SKIP"])
    assert (out / "genotypes" / "search_0.json").read_text() == (out / "search" / "search_0" / "genotype.json"
                                                                  ).read_text()


def test_searches_from_another_benchmark_retrains_its_cells_without_searching(smoke, tmp_path, capsys):
    """--searches-from DIR: that benchmark's finished searches are this one's (copied without checkpoints), so a
    proxy-budget benchmark retrains the cells of a full-budget one (to compare the two budgets' rankings); a search that
    DIR has not finished is refused before any run."""
    source, _ = smoke
    out = tmp_path / "proxy"
    assert bench.main(["--out", str(out), "--smoke", "--searches", "1", "--searches-from", str(source),
                       "--searches-only"]) == 0
    assert not (out / "logs" / "search.log").exists()  # no search ran
    assert not (out / "search" / "search_0" / "checkpoints").exists()
    assert (out / "genotypes" / "search_0.json").read_text() == (source / "search" / "search_0" / "genotype.json"
                                                                  ).read_text()
    capsys.readouterr()
    assert bench.main(["--out", str(tmp_path / "two"), "--smoke", "--searches", "2", "--searches-from",
                       str(source)]) == 2
    assert "search_1 is not a finished search" in capsys.readouterr().err
    assert not (tmp_path / "two" / "retrain").exists()


def test_smoke_entropy_matches_the_search_log(smoke):
    out, _ = smoke
    summary = json.loads((out / "summary.json").read_text())
    assert [search["seed"] for search in summary["searches"]] == [0]
    for search in summary["searches"]:
        log = (Path(search["run_dir"]) / "search.log").read_text()
        logged = float(re.findall(r"\bentropy ([0-9.]+)", log)[-1])  # the last epoch's, 4 significant digits
        entropy = search["alpha_entropy"]
        assert entropy["mean"] == pytest.approx(logged, abs=6e-4)
        assert entropy["mean"] == pytest.approx((entropy["normal"] + entropy["reduce"]) / 2)
        assert 0 < entropy["mean"] <= math.log(len(DARTS)) + 1e-9


def test_smoke_budget_stats_and_outputs(smoke):
    out, stdout = smoke
    summary = json.loads((out / "summary.json").read_text())
    budget = summary["budget"]
    assert budget["train_overrides"] == ["experiment=smoke", "logger=none"] == budget["search_overrides"]
    assert budget["epochs"] == 1 and budget["retrain_seeds"] == [0] and budget["search_seeds"] == [0]
    assert budget["launcher"] == "basic" and budget["name"] == "smoke"
    assert (budget["network"]["layers"], budget["network"]["channels"]) == (3, 4)
    for arm in bench.ARMS:
        accuracies = [run["test_acc"] for run in summary[arm]]
        assert summary["stats"][arm]["mean"] == pytest.approx(statistics.fmean(accuracies))
        assert summary["stats"][arm]["n"] == len(accuracies)
        assert summary["minutes"][arm]["retrain_wall"] > 0 and summary["minutes"][arm]["devices"] == ["cpu"]
    assert summary["minutes"]["searched"]["search_wall"] > 0
    assert summary["verdict"]["searched_beats_random"] in (True, False)
    darts_v2 = next(run["test_acc"] for run in summary["reference"] if run["source"] == "DARTS_V2")
    assert summary["verdict"]["searched_beats_darts_v2"] is (summary["stats"]["searched"]["mean"] >= darts_v2)
    assert summary["search_spread"]["cells"] == 1 and summary["search_spread"]["pairs"] == 0
    # the smoke's random cells are the full benchmark's (one space, one seed each): ranked against its rows
    agreement = summary["rank_agreement"]
    assert {pair["cell"] for pair in agreement["cells"]} == {"DARTS_V2", "random_0", "random_1"}
    assert bench.rank_agreement_line(agreement) in stdout
    markdown = (out / "summary.md").read_text()
    assert "| searched | 1 |" in markdown and "| poor | 1 |" in markdown and "budget **smoke**" in markdown
    assert "Searches' spread: 1 searched cell(s)" in markdown
    assert "- searched: retrain " in markdown and ", search " in markdown
    assert budget["omp_num_threads"] == os.environ.get("OMP_NUM_THREADS")
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = stdout.strip().splitlines()
    assert lines[-1].startswith("| poor | 1 |") and lines[-6].startswith("| arm | n |")
    assert lines[-9].startswith("searched >= random + 1 std?") and lines[-8].startswith("poor < random - 1 std?")
    assert lines[-7].startswith("searched >= DARTS_V2?")


@pytest.mark.slow
def test_resume_reuses_finished_runs_and_reruns_an_unfinished_one(smoke, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(smoke[0], out)
    unfinished = out / "retrain" / "random_1_seed0"
    (unfinished / "metrics.json").unlink()
    shutil.rmtree(unfinished / "checkpoints")  # stopped before its first checkpoint: redone (test_common: resumed)
    kept = {path: path.stat().st_mtime_ns for path in out.glob("*/*/metrics.json") if path.parent != unfinished}
    search = out / "search" / "search_0" / "genotype.json"
    kept[search] = search.stat().st_mtime_ns
    assert bench.main(["--out", str(out), "--smoke", "--searches", "1", "--resume"]) == 0
    assert {path: path.stat().st_mtime_ns for path in kept} == kept  # not run again
    assert (unfinished / "metrics.json").is_file()
    # the resumed stage is a multirun of the unfinished job alone (the search stage has nothing left: not run)
    (command,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert command.count(".json'") == 1 and "random_1.json'" in command
    before = json.loads((smoke[0] / "summary.json").read_text())
    after = json.loads((out / "summary.json").read_text())
    # the rerun retrain (alone in its process, not the third job of one) is the same seeded CPU run
    assert after["stats"] == before["stats"]


def test_progress_reports_what_finished_and_runs_nothing(smoke, tmp_path, capsys):
    """--progress on a benchmark part-way: the finished retrains by arm, the missing ones, the verdict so far; no run
    starts (the unfinished retrains stay without metrics) and no summary is written."""
    out = tmp_path / "part-way"
    shutil.copytree(smoke[0], out, ignore=shutil.ignore_patterns("summary.*"))
    for name in ("random_1_seed0", "POOR_POOL_SKIP_seed0"):
        (out / "retrain" / name / "metrics.json").unlink()
    assert bench.main(["--out", str(out), "--smoke", "--searches", "1", "--progress"]) == 0
    printed = capsys.readouterr().out
    progress = json.loads((out / "progress.json").read_text())
    assert progress["missing"] == ["random_1_seed0", "POOR_POOL_SKIP_seed0"]
    assert [len(progress[arm]) for arm in bench.ARMS] == [1, 1, 2, 0]
    assert set(progress["stats"]) == {"searched", "random", "reference"}
    assert progress["budget"]["epochs"] == before_budget(smoke)["epochs"]
    assert progress["verdict_so_far"][0].startswith("searched >= random + 1 std? undecided")
    assert "still missing: random_1_seed0, POOR_POOL_SKIP_seed0" in printed and "- so far: " in printed
    assert progress["search_spread"]["cells"] == 1 and "Searches' spread: 1 searched cell(s)" in printed
    assert not (out / "retrain" / "random_1_seed0" / "metrics.json").exists() and not (out / "summary.json").exists()
    before = json.loads((smoke[0] / "summary.json").read_text())
    assert progress["searched"][0]["test_acc"] == before["searched"][0]["test_acc"]


def test_progress_says_where_an_unfinished_retrain_stands_from_its_log(smoke, tmp_path, capsys):
    """A retrain stopped and resumed (no metrics.json yet, a resumed piece in its log): its last logged epoch
    and test accuracy; a run with no epoch logged is left out."""
    out = tmp_path / "stopped"
    shutil.copytree(smoke[0], out, ignore=shutil.ignore_patterns("summary.*"))
    for name in ("random_1_seed0", "POOR_POOL_SKIP_seed0"):
        (out / "retrain" / name / "metrics.json").unlink()
    line = ("[2026-11-29 00:5{}:00,000][aso_se.monitor.progress][INFO] - retrain epoch {}/9 | train_loss 1.2  "
            "test_acc {}")
    (out / "retrain" / "random_1_seed0" / "train.log").write_text("\n".join([
        line.format(1, 3, 0.41), line.format(2, 4, 0.47), "... resumed from checkpoints/last.pt",
        line.format(3, 4, 0.4625), line.format(4, 5, 0.5031), ""]))
    (out / "retrain" / "POOR_POOL_SKIP_seed0" / "train.log").write_text("[2026-11-29 00:50:00,000] train run in x\n")
    assert bench.main(["--out", str(out), "--smoke", "--searches", "1", "--progress"]) == 0
    printed = capsys.readouterr().out
    progress = json.loads((out / "progress.json").read_text())
    assert progress["in_training"] == {"random_1_seed0": {"epoch": 5, "epochs": 9, "test_acc": 0.5031}}
    assert "In training (last logged epoch): random_1_seed0 at epoch 5/9, test acc 0.5031." in printed
    assert progress["missing"] == ["random_1_seed0", "POOR_POOL_SKIP_seed0"]  # still missing: not finished


def test_progress_says_where_a_search_without_a_cell_stands_from_its_log(smoke, tmp_path, capsys):
    """A second search stopped and resumed (no cell yet; a resumed piece in its log): its last logged epoch of
    the schedule's total, read from its config (the fifth change's: 30 + 18 + 4, 5 + 18 + 4, 5 + 18 = 102 epochs)."""
    from omegaconf import OmegaConf

    out = tmp_path / "searching"
    shutil.copytree(smoke[0], out, ignore=shutil.ignore_patterns("summary.*"))
    run = out / "search" / "search_1"
    shutil.copytree(out / "search" / "search_0" / ".hydra", run / ".hydra")
    config = OmegaConf.load(run / ".hydra" / "config.yaml")
    config.search.schedule.update(cycles=3, first_warmup_epochs=30, warmup_epochs=5, search_epochs=18,
                                  restabilize_epochs=4)
    OmegaConf.save(config, run / ".hydra" / "config.yaml")
    line = "[2026-11-29 01:5{}:00,000][aso_se.monitor.progress][INFO] - cycle {} {} (epoch {}) | loss 0.9  accuracy 0.6"
    (run / "search.log").write_text("\n".join([
        line.format(1, 0, "search", 48), line.format(2, 1, "warmup", 53), "... resumed from checkpoints",
        line.format(3, 0, "restabilize", 52), line.format(4, 1, "warmup", 56), "cycle 1: genotype ...", ""]))
    assert bench.main(["--out", str(out), "--smoke", "--searches", "2", "--progress"]) == 0
    progress = json.loads((out / "progress.json").read_text())
    assert progress["searching"] == {"search_1": {"epoch": 56, "epochs": 102, "cycle": 1, "phase": "warmup"}}
    assert "Searching (last logged epoch): search_1 at epoch 56/102 (cycle 1, warmup)." in capsys.readouterr().out
    (run / "search.log").write_text("[2026-11-29 01:50:00,000] search run in x\n")  # no epoch logged: left out
    assert bench.main(["--out", str(out), "--smoke", "--searches", "2", "--progress"]) == 0
    assert json.loads((out / "progress.json").read_text())["searching"] == {}


def test_progress_says_what_the_missing_searched_retrains_must_average(smoke, tmp_path, capsys):
    """A second search not yet retrained: the average it needs for the searched mean to reach DARTS_V2 and random +
    1 std (a candidate change's stopping rule)."""
    out = tmp_path / "one-of-two"
    shutil.copytree(smoke[0], out, ignore=shutil.ignore_patterns("summary.*"))
    assert bench.main(["--out", str(out), "--smoke", "--searches", "2", "--progress"]) == 0
    progress = json.loads((out / "progress.json").read_text())
    assert "search_1_seed0" in progress["missing"]
    (searched,) = [run["test_acc"] for run in progress["searched"]]
    darts_v2 = [run["test_acc"] for run in progress["reference"] if run["source"] == "DARTS_V2"][0]
    random_bar = progress["stats"]["random"]["mean"] + progress["stats"]["random"]["std"]
    assert progress["searched_needs"] == pytest.approx({"DARTS_V2": 2 * darts_v2 - searched,
                                                        "random + 1 std": 2 * random_bar - searched})
    printed = capsys.readouterr().out
    assert "still needed: the 1 missing searched retrain(s) must average" in printed
    assert "(random + 1 std) for the searched mean to reach each" in printed
    (out / "retrain" / "random_1_seed0" / "metrics.json").unlink()  # one random run: no std, DARTS_V2 the one bar
    assert bench.main(["--out", str(out), "--smoke", "--searches", "2", "--progress"]) == 0
    assert set(json.loads((out / "progress.json").read_text())["searched_needs"]) == {"DARTS_V2"}
    assert "(DARTS_V2) for the searched mean to reach it" in capsys.readouterr().out


def test_searched_needs_is_the_mean_over_all_retrains_solved_for_the_missing() -> None:
    needs = bench.searched_needs([0.9335, 0.9267], 1, {"DARTS_V2": 0.9352, "random + 1 std": None})
    assert needs == pytest.approx({"DARTS_V2": 0.9454})
    assert bench.searched_needs([0.93], 0, {"DARTS_V2": 0.9352}) == {}
    assert bench.searched_needs([], 3, {"DARTS_V2": 0.9352}) == pytest.approx({"DARTS_V2": 0.9352})


def test_progress_counts_a_two_process_run_rebuilt_from_its_log_and_names_what_it_lacks(smoke, tmp_path, capsys):
    """A reference arm trained by torchrun on 2 processes at half the batch each (one global batch), whose machine
    was lost before its energy report (a metrics.json rebuilt from its log: energy pending, no CPU time)."""
    out = tmp_path / "two-process"
    shutil.copytree(smoke[0], out, ignore=shutil.ignore_patterns("summary.*"))
    run = out / "retrain" / "DARTS_V2_seed0"
    batch = before_budget(smoke)["batch_size"]
    config = run / ".hydra" / "config.yaml"
    text = config.read_text().replace(f"batch_size: {batch}\n", f"batch_size: {batch // 2}\n", 1)
    config.write_text(text.replace("  ddp: false\n", "  ddp: true\n", 1))
    assert f"batch_size: {batch // 2}\n" in config.read_text() and "  ddp: true\n" in config.read_text()
    metrics = json.loads((run / "metrics.json").read_text())
    for key in ("energy_per_image_uj", "firing_rate_mean"):
        metrics.pop(key, None)
    metrics.update(world_size=2, global_batch_size=batch, cpu_time_s=None, pending=["energy", "firing_rates"],
                   recovered_from="train.log")
    (run / "metrics.json").write_text(json.dumps(metrics))
    assert bench.main(["--out", str(out), "--smoke", "--searches", "1", "--progress"]) == 0
    printed = capsys.readouterr().out
    assert ("Evaluations pending: DARTS_V2_seed0 (energy, firing_rates; figures rebuilt from its train.log)."
            in printed)
    progress = json.loads((out / "progress.json").read_text())
    assert progress["budget"]["batch_size"] == batch and progress["stats"]["reference"]["energy_uj"] is None


def before_budget(smoke):
    return json.loads((smoke[0] / "summary.json").read_text())["budget"]


def test_progress_refuses_runs_of_two_budgets(smoke, tmp_path, capsys):
    out = tmp_path / "mixed"
    shutil.copytree(smoke[0], out, ignore=shutil.ignore_patterns("summary.*"))
    config = out / "retrain" / "random_0_seed0" / ".hydra" / "config.yaml"
    config.write_text(config.read_text().replace(f"epochs: {before_budget(smoke)['epochs']}\n", "epochs: 999\n", 1))
    assert bench.main(["--out", str(out), "--smoke", "--searches", "1", "--progress"]) == 1
    assert "random_0_seed0 ran with different configs" in capsys.readouterr().err


def test_a_run_of_another_cell_than_its_genotype_file_is_refused(smoke, tmp_path, capsys):
    """A cell file written again after its retrain (a search rerun, other random seeds) must not lend its name to the
    old run's accuracy: the report stops with one line naming the run and the file."""
    out = tmp_path / "rewritten"
    shutil.copytree(smoke[0], out, ignore=shutil.ignore_patterns("summary.*"))
    other = (out / "genotypes" / "random_1.json").read_text()
    assert other != (out / "genotypes" / "random_0.json").read_text()
    (out / "genotypes" / "random_0.json").write_text(other)
    assert bench.main(["--out", str(out), "--smoke", "--searches", "1", "--progress"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "random_0_seed0 trained another cell than" in line and line.rstrip().endswith("the cell it trained")
    assert not (out / "progress.json").exists()


SEVEN_OPS = ("search_space.primitives=[none,max_pool_3x3,avg_pool_3x3,skip_connect,sep_conv_3x3,sep_conv_5x5,"
             "dil_conv_3x3]")


def test_cells_only_registers_a_changes_random_cells_and_never_replaces_them(tmp_path, capsys):
    """--cells-only: the cells fixed before any search, drawn under the search overrides (here a space without
    dil_conv_5x5 and no pool in the normal cell), with no search or retrain; the same flags again change nothing,
    other flags are refused with one line and leave the registered cells as they were."""
    out = tmp_path / "seventh"
    flags = ["--out", str(out), "--smoke", "--randoms", "3", "--search-override", SEVEN_OPS,
             "--search-override", "search.evolution.max_normal_pools=0"]
    assert bench.main([*flags, "--cells-only"]) == 0
    assert "cells written" in capsys.readouterr().out
    assert sorted(path.name for path in out.iterdir()) == ["genotypes"]
    written = {path.stem: path.read_text() for path in (out / "genotypes").glob("*.json")}
    assert sorted(written) == sorted(["random_0", "random_1", "random_2", "DARTS_V2", "PC_DARTS", "POOR_POOL_SKIP"])
    space = ("none", "max_pool_3x3", "avg_pool_3x3", "skip_connect", "sep_conv_3x3", "sep_conv_5x5", "dil_conv_3x3")
    for seed in range(3):
        cell = Genotype.from_json(written[f"random_{seed}"])
        assert {op for op, _ in cell.normal + cell.reduce} <= set(space)
        assert not {op for op, _ in cell.normal} & set(POOL_OPS)
    seventh_randoms = {path.stem: path.read_text() for path in (out / "genotypes").glob("random_*.json")}
    assert bench.main(["--out", str(tmp_path / "darts"), "--smoke", "--randoms", "3", "--cells-only"]) == 0
    assert any((tmp_path / "darts" / "genotypes" / f"{name}.json").read_text() != text
               for name, text in seventh_randoms.items())  # the overrides reached the draw
    assert bench.main([*flags, "--cells-only"]) == 0  # the same flags: the same cells
    assert {path.stem: path.read_text() for path in (out / "genotypes").glob("*.json")} == written
    capsys.readouterr()
    (out / "genotypes" / "PC_DARTS.json").unlink()  # refused flags write no cell, not even a missing one
    assert bench.main(["--out", str(out), "--smoke", "--randoms", "3", "--cells-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds another cell than these flags draw" in err and "random_" in err
    del written["PC_DARTS"]
    assert {path.stem: path.read_text() for path in (out / "genotypes").glob("*.json")} == written


def test_progress_needs_a_started_benchmark(tmp_path, capsys):
    assert bench.main(["--out", str(tmp_path / "none"), "--smoke", "--progress"]) == 2
    assert "holds no benchmark (no genotypes/ or search/)" in capsys.readouterr().err


@pytest.mark.slow
def test_a_failed_run_stops_the_benchmark_with_one_line(tmp_path):
    result = run_benchmark("--out", str(tmp_path / "out"), "--smoke", "--search-override", "search.schedule.cycles=0")
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    log = tmp_path / "out" / "logs" / "search.log"
    assert line.startswith(f"search_vs_random: a multirun failed (exit 2; unfinished: {tmp_path / 'out' / 'search'}/"
                           "search_0, ")
    assert f"its log is {log}: " in line and "need cycles >= 1" in line
    assert not (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["seed=3"], "sets seed, which the benchmark sets for every run"),
        (["hydra.run.dir=/tmp/x"], "sets hydra.run.dir"),
        (["hydra.sweep.dir=/tmp/x"], "--out sets the run dirs, --launcher the launcher"),
        (["data"], "is not a Hydra override"),
        (["--train-override", "+genotype=DARTS_V1"], "sets genotype"),
    ],
)
def test_bad_input_is_refused(tmp_path, args, message, capsys):
    assert bench.main(["--out", str(tmp_path / "out"), "--smoke", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--launcher", "mpi"], "invalid choice: 'mpi'"),
    (["--parallel", "2"], "--parallel is gone: the runs are Hydra multiruns; pass --launcher local_gpus"),
])
def test_bad_flags_end_before_any_run(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as stop:
        bench.main(["--out", str(tmp_path / "out"), "--smoke", *args])
    assert stop.value.code == 2 and message in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_non_empty_out_dir_is_refused(tmp_path, capsys):
    (tmp_path / "old.txt").write_text("keep me")
    assert bench.main(["--out", str(tmp_path), "--smoke"]) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "--resume" in err and (tmp_path / "old.txt").read_text() == "keep me"


def test_overrides_that_do_not_compose_are_refused_before_any_run(tmp_path, capsys):
    assert bench.main(["--out", str(tmp_path / "out"), "--smoke", "search.schedule.cycles=1"]) == 2
    err = capsys.readouterr().err
    assert "train.py rejects the overrides" in err and "--search-override" in err
    assert not (tmp_path / "out" / "logs").exists()


# ----------------------------------------------------------------------------- the plan
def test_the_cifar10_plan_and_its_flags(tmp_path):
    plan = bench.make_plan(bench.parse_args(["--out", str(tmp_path), "data.root=/d", "--retrain-epochs", "7",
                                             "--device", "cuda", "--train-override", "batch_size=32"]))
    assert plan.search_overrides == ("experiment=cifar10_snn", "trainer.device=cuda", "data.root=/d")
    assert plan.train_overrides == ("experiment=cifar10_snn", "epochs=7", "model.network.layers=8",
                                    "model.network.channels=16", "trainer.device=cuda", "data.root=/d",
                                    "batch_size=32")
    assert (plan.search_seeds, plan.random_seeds, plan.retrain_seeds) == ((0, 1, 2), (0, 1, 2, 3, 4), (0,))
    (sweep,) = bench.retrain_sweeps(plan, ["search_0", "random_3"])
    assert sweep.command(("+sweep=local_gpus",))[2:] == [
        "-m", "+sweep=local_gpus", *plan.train_overrides, "seed=0",
        f"genotype='{tmp_path / 'genotypes' / 'search_0.json'}','{tmp_path / 'genotypes' / 'random_3.json'}'",
        f"hydra.sweep.dir='{tmp_path / 'retrain'}'", "hydra.sweep.subdir='${aso_se.stem:${genotype}}_seed0'"]
    assert sweep.run_dirs() == [tmp_path / "retrain" / "search_0_seed0", tmp_path / "retrain" / "random_3_seed0"]


@pytest.mark.parametrize("experiment", ["cifar10_qann", "cifar10_binary_snn"])
def test_the_qann_experiment_is_every_runs_experiment(tmp_path, experiment):
    plan = bench.make_plan(bench.parse_args(["--out", str(tmp_path), "--experiment", experiment]))
    assert plan.search_overrides == (f"experiment={experiment}",)
    assert plan.train_overrides[0] == f"experiment={experiment}"
    rules = bench.search_space_rules(plan)  # both entry points compose it
    assert rules.primitives == PRIMITIVE_SETS["darts"]


def test_the_full_budget_retrains_the_fast_experiment_and_flags_still_win(tmp_path):
    """--budget full composes its overrides (no run): the searches stay cifar10_qann, the retrains take
    cifar10_qann_fast's own 20 x 36, 180 epochs at its global batch, in fp16; an explicit --retrain-* flag overrides
    it."""
    plan = bench.make_plan(bench.parse_args(["--out", str(tmp_path), "--budget", "full", "data.root=/d"]))
    assert plan.budget == "full"
    assert plan.search_overrides == ("experiment=cifar10_qann", "data.root=/d")
    assert plan.train_overrides == ("experiment=cifar10_qann_fast", "batch_size=1024", "trainer.precision=fp16",
                                    "data.root=/d")
    bench.search_space_rules(plan)  # both entry points compose it
    train = bench.compose_config("train", (*plan.train_overrides, "genotype=PC_DARTS"))
    assert (train.epochs, train.model.network.layers, train.model.network.channels) == (180, 20, 36)
    assert (train.batch_size, train.trainer.precision) == (1024, "fp16")
    plan = bench.make_plan(bench.parse_args(["--out", str(tmp_path), "--budget", "full", "--retrain-epochs", "50",
                                             "--train-override", "batch_size=512"]))
    assert plan.train_overrides == ("experiment=cifar10_qann_fast", "batch_size=1024", "trainer.precision=fp16",
                                    "epochs=50", "batch_size=512")
    proxy = bench.make_plan(bench.parse_args(["--out", str(tmp_path)]))
    assert proxy.budget == "proxy" and proxy.train_overrides[:4] == (
        "experiment=cifar10_snn", "epochs=30", "model.network.layers=8", "model.network.channels=16")


@pytest.mark.parametrize("args, message", [
    (["--budget", "full", "--experiment", "cifar10_snn"], "drop --experiment cifar10_snn"),
    (["--budget", "full", "--smoke"], "--smoke is its own budget"),
])
def test_the_full_budget_refuses_what_it_cannot_run(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", str(tmp_path), *args])
    assert message in capsys.readouterr().err


def test_the_smoke_plan_keeps_the_experiments_network_unless_told(tmp_path):
    plan = bench.make_plan(bench.parse_args(["--out", str(tmp_path), "--smoke", "--retrain-layers", "5"]))
    assert plan.train_overrides == ("experiment=smoke", "logger=none", "model.network.layers=5")
    assert plan.search_overrides == ("experiment=smoke", "logger=none") and plan.search_seeds == (0, 1)


def test_search_space_rules_follow_the_overrides(tmp_path):
    plan = bench.make_plan(bench.parse_args(["--out", str(tmp_path), "--smoke", "--search-override",
                                             "search_space=spiking", "--search-override",
                                             "search.evolution.max_skip_connect=1", "--search-override",
                                             "search.evolution.max_parameter_free=2", "--search-override",
                                             "search.evolution.max_normal_pools=0", "--randoms", "6"]))
    rules = bench.search_space_rules(plan)
    assert rules.primitives == PRIMITIVE_SETS["spiking"] and (rules.steps, rules.multiplier) == (4, 4)
    assert (rules.max_skip_connect, rules.max_parameter_free, rules.max_normal_pools) == (1, 2, 0)
    assert rules.config["max_normal_pools"] == 0
    cells = bench.fixed_cells(plan, rules)["random"]
    assert all({op for op, _ in g.normal + g.reduce} <= set(PRIMITIVE_SETS["spiking"]) for g in cells.values())
    assert all(sum(op in PARAMETER_FREE_OPS for op, _ in edges) <= 2 for g in cells.values()
               for edges in (g.normal, g.reduce))
    assert not any(op in POOL_OPS for g in cells.values() for op, _ in g.normal)


def test_an_op_list_override_reaches_the_random_cells(tmp_path):
    # the seventh candidate change: the DARTS space without dil_conv_5x5, given as a list of op names
    ops = [op for op in PRIMITIVE_SETS["darts"] if op != "dil_conv_5x5"]
    plan = bench.make_plan(bench.parse_args(["--out", str(tmp_path), "--smoke", "--search-override",
                                             f"search_space.primitives=[{','.join(ops)}]", "--randoms", "8"]))
    rules = bench.search_space_rules(plan)
    assert rules.primitives == tuple(ops) and rules.config["search_space"]["primitives"] == ops
    cells = bench.fixed_cells(plan, rules)["random"]
    used = {op for g in cells.values() for op, _ in g.normal + g.reduce}
    assert "dil_conv_5x5" not in used and "dil_conv_3x3" in used


# ----------------------------------------------------------------------------- statistics and entropy
def test_arm_stats_means_and_missing_firing_rates():
    runs = [{"test_acc": 0.6, "params_m": 1.0, "firing_rate_mean": 0.1},
            {"test_acc": 0.8, "params_m": 3.0, "firing_rate_mean": 0.3}]
    stats = bench.arm_stats(runs)
    assert (stats.n, stats.mean, stats.params_m, stats.firing_rate) == (2, pytest.approx(0.7), 2.0, pytest.approx(0.2))
    assert stats.std == pytest.approx(math.sqrt(0.02))
    assert bench.arm_stats([{**runs[0], "firing_rate_mean": None}, runs[1]]).firing_rate is None
    assert (stats.snn_acc, stats.energy_uj) == (None, None)  # runs without an SNN or an energy report
    qann = [{**runs[0], "snn_test_acc": 0.5, "energy_per_image_uj": 100.0},
            {**runs[1], "snn_test_acc": 0.7, "energy_per_image_uj": 300.0}]
    assert (bench.arm_stats(qann).snn_acc, bench.arm_stats(qann).energy_uj) == (pytest.approx(0.6), 200.0)


def stats_of(searched: float, random_mean: float, random_std: float | None, poor: float) -> dict[str, ArmStats]:
    return {"searched": ArmStats(3, searched, 0.01, 1.0, 0.1), "random": ArmStats(5, random_mean, random_std, 1.0, 0.1),
            "reference": ArmStats(1, 0.9, None, 1.0, 0.1), "poor": ArmStats(1, poor, None, 0.5, 0.2)}


@pytest.mark.parametrize(
    ("searched", "poor", "beats", "below"),
    # random: 0.75 ± 0.125 (exact in binary, so the bounds 0.875 and 0.625 are hit exactly)
    [(0.875, 0.5, True, True), (0.87, 0.625, False, False), (0.95, 0.7, True, False), (0.8, 0.62, False, True)],
)
def test_verdict_against_one_random_std(searched, poor, beats, below):
    decision = bench.verdict(stats_of(searched, 0.75, 0.125, poor))
    assert (decision.searched_beats_random, decision.poor_below_random) == (beats, below)
    assert decision.lines[0].startswith(f"searched >= random + 1 std? {'YES' if beats else 'NO'} ({searched:.4f}")
    assert decision.lines[1].startswith(f"poor < random - 1 std? {'YES' if below else 'NO'} ({poor:.4f}")


def test_verdict_is_undecided_without_a_random_spread_or_a_darts_v2_run():
    decision = bench.verdict(stats_of(0.9, 0.8, None, 0.1))
    assert decision.searched_beats_random is None and decision.poor_below_random is None
    assert decision.searched_beats_darts_v2 is None
    assert all("undecided" in line for line in decision.lines) and len(decision.lines) == 3


@pytest.mark.parametrize(("darts_v2", "beats"), [(0.875, True), (0.8751, False), (0.5, True)])
@pytest.mark.parametrize("random_std", [0.125, None])
def test_verdict_against_darts_v2_whatever_the_random_spread(darts_v2, beats, random_std):
    decision = bench.verdict(stats_of(0.875, 0.75, random_std, 0.5), darts_v2)
    assert decision.searched_beats_darts_v2 is beats
    assert decision.lines[2] == f"searched >= DARTS_V2? {'YES' if beats else 'NO'} (0.8750 vs {darts_v2:.4f})"


def test_verdict_without_a_poor_run_is_undecided_on_the_floor_only():
    stats = stats_of(0.875, 0.75, 0.125, 0.5)
    del stats["poor"]
    decision = bench.verdict(stats, 0.9)
    assert (decision.searched_beats_random, decision.poor_below_random, decision.searched_beats_darts_v2) == (
        True, None, False)
    assert decision.lines[1] == "poor < random - 1 std? undecided: no poor run"


def test_the_judged_quantity_is_the_deployed_binary_snn_at_t(tmp_path):
    """--judge snn_t4 / snn_t8: the arms' means, the verdict and the DARTS_V2 bar read the binary SNN's accuracy at T
    (the fine-tuned SNN's where train.py fine-tuned it), not the QANN's; a run without it is named."""
    runs = [{"test_acc": 0.9, "params_m": 1.0, "snn_acc_at_t": {"4": 0.5, "8": 0.75}, "source": "search_0"},
            {"test_acc": 0.8, "params_m": 1.0, "snn_acc_at_t": {"4": 0.25, "8": 0.5}, "source": "search_1"}]
    assert bench.arm_stats(runs).mean == pytest.approx(0.85)
    assert bench.arm_stats(runs, "snn_t4").mean == pytest.approx(0.375)
    assert bench.arm_stats(runs, "snn_t8").mean == pytest.approx(0.625)
    arms = {"reference": [{**runs[0], "source": "DARTS_V2"}]}
    assert bench.darts_v2_mean(arms, "snn_t8") == 0.75 and bench.darts_v2_mean(arms) == 0.9
    decision = bench.verdict(stats_of(0.875, 0.75, 0.125, 0.5), 0.9, bench.JUDGED["snn_t4"])
    assert decision.lines[0].endswith("binary SNN accuracy at T = 4)")
    with pytest.raises(bench.BenchmarkError, match="no binary SNN accuracy at T = 4.*QANN retrains"):
        bench.arm_stats([{"test_acc": 0.9, "params_m": 1.0, "snn_acc_at_t": {}, "run_dir": "r"}], "snn_t4")
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 0\n")
    metrics = {"test_acc": 0.9, "params_m": 1.0, "genotype": GENOTYPES["DARTS_V2"].to_json(), "wall_time_s": 60,
               "cpu_time_s": 60, "snn_acc_at_t": {"4": 0.2}}
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    assert bench.collect_retrain(run_dir, "search_0")["snn_acc_at_t"] == {"4": 0.2}  # the converted SNN's
    (run_dir / "metrics.json").write_text(json.dumps({**metrics, "snn_finetune": {"acc_at_t": {"4": 0.7}}}))
    assert bench.collect_retrain(run_dir, "search_0")["snn_acc_at_t"] == {"4": 0.7}  # the fine-tuned one's


def test_the_pareto_picture_needs_every_runs_snn_accuracy_and_energy(tmp_path):
    def run(source, accuracy, energy):
        return {"source": source, "snn_acc_at_t": {"8": accuracy}, "snn_energy_uj": energy}

    arms = {"searched": [run("search_0", 0.8, 90.0), run("search_1", 0.82, 80.0)],
            "random": [run("random_0", 0.78, 150.0)], "reference": [run("DARTS_V2", 0.81, 120.0)], "poor": []}
    assert bench.pareto_plot(arms, tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").stat().st_size > 1000
    arms["random"].append({"source": "random_1", "snn_acc_at_t": {}, "snn_energy_uj": 100.0})  # a BPTT or ReLU run
    assert not bench.pareto_plot(arms, tmp_path / "none.png") and not (tmp_path / "none.png").exists()


def test_table_rows():
    text = bench.table({"random": ArmStats(5, 0.81234, 0.0123, 0.25, None, 0.81, 71342.9),
                        "poor": ArmStats(1, 0.5, None, 0.1, 0.3)})
    assert text.splitlines()[2:] == ["| random | 5 | 0.8123 ± 0.0123 | 0.2500 | n/a | 0.8100 | 71,343 |",
                                     "| poor | 1 | 0.5000 ± n/a | 0.1000 | 0.3000 | n/a | n/a |"]


def test_alpha_entropy_by_hand():
    torch.manual_seed(0)
    alpha = torch.randn(3, 4)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1, 2] = False  # pruned: it takes no probability
    state = {"arch.normal.alpha": alpha, "arch.normal.op_mask": mask,
             "cells.0.weight": torch.randn(2), "arch.reduce.alpha": torch.zeros(3, 4),
             "arch.reduce.op_mask": torch.ones(3, 4, dtype=torch.bool)}

    def by_hand(row: list[float]) -> float:
        total = sum(math.exp(value) for value in row)
        return -sum(math.exp(value) / total * math.log(math.exp(value) / total) for value in row)

    rows = [[v for v, keep in zip(alpha[e].tolist(), mask[e].tolist()) if keep] for e in range(3)]
    normal = [by_hand(row) for row in rows]
    entropy = bench.alpha_entropy(state)
    assert entropy["normal"] == pytest.approx(statistics.fmean(normal))
    assert entropy["reduce"] == pytest.approx(math.log(4))
    assert entropy["mean"] == pytest.approx(statistics.fmean(normal + [math.log(4)] * 3))


# ----------------------------------------------------------------------------- random cells are derivable
def _probabilities_choosing(edges: tuple[tuple[str, int], ...], steps: int) -> torch.Tensor:
    """α probabilities under which DARTS's derivation picks exactly ``edges`` (first of a node strongest)."""
    offsets = [sum(node + 2 for node in range(n)) for n in range(steps)]
    probs = torch.full((offsets[-1] + steps + 1, len(DARTS)), 0.01)
    probs[:, DARTS.index("none")] = 0.5  # none is the strongest op everywhere, and must never be chosen
    for position, (op, index) in enumerate(edges):
        probs[offsets[position // 2] + index, DARTS.index(op)] = 0.3 - 0.1 * (position % 2)
    return probs


def test_random_cells_are_what_the_search_derivation_can_produce():
    rng = random.Random(11)
    for _ in range(50):
        genotype = random_genotype(DARTS, 4, rng, 2)
        derived = derive_genotype(_probabilities_choosing(genotype.normal, 4),
                                  _probabilities_choosing(genotype.reduce, 4), DARTS, steps=4, multiplier=4,
                                  max_skip_connect=2)
        assert derived == genotype


# ----------------------------------------------------------------------------- the searches' spread
def test_genotype_distance_by_hand():
    a = GENOTYPES["DARTS_V2"]
    assert bench.genotype_distance(a, a) == {"normal": 0, "reduce": 0}
    normal = list(a.normal)
    normal[0], normal[1] = normal[1], normal[0]  # the same node's edges swapped: the same cell
    normal[2] = ("avg_pool_3x3", normal[2][1])  # another op on one edge
    normal[7] = (normal[7][0], 0 if normal[7][1] else 1)  # another input on one edge
    b = Genotype(normal=normal, normal_concat=a.normal_concat, reduce=a.reduce, reduce_concat=a.reduce_concat)
    assert bench.genotype_distance(a, b) == bench.genotype_distance(b, a) == {"normal": 2, "reduce": 0}


def test_search_spread_of_three_cells():
    cells = {"search_0": GENOTYPES["DARTS_V2"], "search_1": GENOTYPES["DARTS_V2"], "search_2": GENOTYPES["PC_DARTS"]}
    runs = [{"source": source, "genotype": json.loads(cell.to_json()), "test_acc": acc}
            for (source, cell), acc in zip(cells.items(), (0.5, 0.6, 0.7))]
    runs.append({**runs[0], "test_acc": 0.7})  # a second retrain seed: search_0's mean is 0.6
    spread = bench.search_spread(list(cells.values()), runs)
    apart = bench.genotype_distance(GENOTYPES["DARTS_V2"], GENOTYPES["PC_DARTS"])
    assert spread["cells"] == 3 and spread["pairs"] == 3
    for kind in ("normal", "reduce"):
        assert spread[kind] == {"edges": 8, "mean": pytest.approx(2 * apart[kind] / 3), "max": apart[kind]}
    assert spread["acc_std"] == pytest.approx(statistics.stdev([0.6, 0.6, 0.7]))
    assert "3 pair(s) of 3 cells" in bench.spread_line(spread)
    one = bench.search_spread([GENOTYPES["DARTS_V2"]], runs[:1])
    assert one["pairs"] == 0 and one["normal"]["mean"] is None and one["acc_std"] is None
    assert "no pair" in bench.spread_line(one)
    untrained = bench.search_spread(list(cells.values()), [])  # the found cells apart before any retrain
    assert untrained["pairs"] == 3 and untrained["normal"] == spread["normal"] and untrained["acc_std"] is None


# ----------------------------------------------------------------------------- the ranking against the full budget
def test_kendall_tau_b_by_hand_and_with_ties_as_scipy_counts_them(monkeypatch):
    assert bench.kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)  # one discordant pair of six
    assert bench.kendall_tau_b([1, 2, 3], [3, 2, 1]) == -1
    # one pair tied in x, one in y, the other four concordant: 4 / sqrt(5 * 5)
    assert bench.kendall_tau_b([1, 1, 2, 3], [1, 2, 2, 3]) == pytest.approx(0.8)
    assert bench.kendall_tau_b([1, 1, 2], [5, 5, 5]) is None  # a ranking of ties alone ranks nothing
    monkeypatch.setitem(sys.modules, "scipy.stats", None)  # as without scipy: the own τ-b, no p-value
    assert bench.kendall_tau([1, 1, 2, 3], [1, 2, 2, 3]) == (pytest.approx(0.8), None)


def test_kendall_tau_is_scipys_where_scipy_is_installed():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(5)
    for _ in range(20):
        x = [rng.randint(0, 4) for _ in range(7)]
        y = [rng.randint(0, 4) for _ in range(7)]
        tau, p = bench.kendall_tau(x, y)
        expected = stats.kendalltau(x, y)
        if math.isnan(expected.statistic):
            assert tau is None and bench.kendall_tau_b(x, y) is None
        else:
            assert tau == pytest.approx(expected.statistic) == bench.kendall_tau_b(x, y)
            assert p == pytest.approx(expected.pvalue)


def _results(tmp_path: Path, proxy_command: str = "python benchmarks/search_vs_random.py --searches-from DIR") -> Path:
    """A results dir: rows of a full benchmark (two seeds of random_0, a cell without a file, a variant's rows, an
    energy row) and of a proxy one, and the full benchmark's cells (search_0 is PC_DARTS here)."""
    from benchmarks.rows import Measurement, append_rows

    results = tmp_path / "results"
    (results / "genotypes").mkdir(parents=True)
    (results / "genotypes" / "search_0.json").write_text(GENOTYPES["PC_DARTS"].to_json())
    (results / "genotypes" / "random_0.json").write_text(random_genotype(DARTS, 4, random.Random(0), 2).to_json())
    full = [Measurement("full/DARTS_V2", "test accuracy", 93.5, "%", "DARTS_V2, retrain seed 0, 20×36"),
            Measurement("full/DARTS_V2", "SNN energy per image", 67756, "µJ", "DARTS_V2"),
            Measurement("full/random", "test accuracy", 93.0, "%", "random_0_seed0"),
            Measurement("full/random", "test accuracy", 92.0, "%", "random_0_seed1"),
            Measurement("full/searched", "test accuracy", 94.0, "%", "search_0, retrain seed 0"),
            Measurement("full/searched", "test accuracy", 91.0, "%", "search_9_seed0"),  # no file: left out
            Measurement("full, a change/searched", "test accuracy", 99.0, "%", "search_0_seed0")]  # another label
    append_rows(results / "search_vs_random.csv", full, command="python benchmarks/search_vs_random.py --budget full")
    proxy = [Measurement("proxy 5/DARTS_V2", "test accuracy", 63.0, "%", "DARTS_V2: the full benchmark's cells"),
             Measurement("proxy 5/random", "test accuracy", 60.0, "%", "random_0: the full benchmark's cells"),
             Measurement("proxy 5/searched", "test accuracy", 65.0, "%", "search_0: the full benchmark's cells")]
    append_rows(results / "search_vs_random.csv", proxy, command=proxy_command)
    return results


def test_the_full_budget_cells_are_its_rows_by_genotype(tmp_path):
    full = bench.full_budget_cells(_results(tmp_path))
    assert {source: accuracies for source, accuracies in full.values()} == {
        "DARTS_V2": [93.5], "random_0": [93.0, 92.0], "search_0": [94.0]}
    assert full[GENOTYPES["PC_DARTS"].to_json()][0] == "search_0"
    assert bench.full_budget_cells(tmp_path / "none") == {}


def test_rank_agreement_pairs_cells_by_genotype_and_needs_three_in_common(tmp_path):
    from benchmarks.accuracy import TAU_METRIC, ranking_row

    full = bench.full_budget_cells(_results(tmp_path))
    runs = [{"source": source, "genotype": json.loads(genotype.to_json()), "test_acc": acc}
            for source, genotype, acc in [("DARTS_V2", GENOTYPES["DARTS_V2"], 0.60),
                                          ("random_0", random_genotype(DARTS, 4, random.Random(0), 2), 0.50),
                                          ("search_0", GENOTYPES["PC_DARTS"], 0.70),  # found again by this budget
                                          ("POOR_POOL_SKIP", GENOTYPES["POOR_POOL_SKIP"], 0.30)]]  # no full row
    agreement = bench.rank_agreement(bench.cells_of_summary(runs), full)
    assert [(pair["cell"], pair["short"], pair["full"]) for pair in agreement["cells"]] == [
        ("DARTS_V2", 60.0, 93.5), ("random_0", 50.0, 92.5), ("search_0", 70.0, 94.0)]
    assert agreement["tau"] == pytest.approx(1.0)  # the same order at both budgets
    assert "1.000 over 3 cells in common (DARTS_V2, random_0, search_0)" in bench.rank_agreement_line(agreement)
    row = ranking_row(agreement, "proxy")
    assert (row.case, row.metric, row.value) == ("proxy/ranking", TAU_METRIC, 1.0)
    assert row.note.startswith("3 cells in common: DARTS_V2, random_0, search_0")
    two = bench.rank_agreement(bench.cells_of_summary(runs[1:]), full)
    assert two["tau"] is None and ranking_row(two, "proxy") is None
    assert bench.rank_agreement_line(two) == ("Kendall τ-b against the full budget: not defined (2 cell(s) in common "
                                              "(random_0, search_0), it needs 3); no row.")


def test_rank_rows_ranks_a_proxy_benchmarks_rows_and_appends_tau(tmp_path, capsys):
    from benchmarks.accuracy import TAU_METRIC
    from benchmarks.rows import read_rows

    results = _results(tmp_path)
    out = tmp_path / "rows.csv"
    assert bench.rank_rows("proxy 5", str(out), results) == 0
    assert "1.000 over 3 cells in common" in capsys.readouterr().out
    [row] = read_rows(out)
    assert (row["case"], row["metric"], row["value"]) == ("proxy 5/ranking", TAU_METRIC, "1.0")
    assert bench.rank_rows("proxy 5", "", results) == 0 and len(read_rows(out)) == 1  # '' writes none
    with pytest.raises(bench.UserInputError, match="no row of case nothing"):
        bench.rank_rows("nothing", "", results)
    searched_anew = _results(tmp_path / "other", proxy_command="python benchmarks/search_vs_random.py --out DIR")
    with pytest.raises(bench.UserInputError, match="--searches-from"):  # its searched cells are not the files
        bench.rank_rows("proxy 5", "", searched_anew)


def test_rank_rows_needs_no_out_dir_and_other_modes_still_do(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--smoke"])
    assert "required: --out" in capsys.readouterr().err
    assert bench.parse_args(["--rank-rows", "proxy"]).rank_rows == "proxy"


# ----------------------------------------------------------------------------- --warm-start
def test_warm_start_retrains_each_cell_as_relu_first_then_from_its_own_relu_run(tmp_path):
    plan = bench.make_plan(bench.parse_args(["--out", str(tmp_path), "--experiment", "cifar10_binary_snn",
                                             "--warm-start", "5", "--warm-lr", "0.03"]))
    (relu,) = bench.relu_sweeps(plan, ["search_0", "random_3"])
    assert relu.stage_dir == tmp_path / "retrain_relu" and relu.overrides[-3:] == (
        "neuron=relu", "snn_finetune.epochs=0", "seed=0")
    assert relu.run_dirs() == [tmp_path / "retrain_relu" / name for name in ("search_0_seed0", "random_3_seed0")]
    (judged,) = bench.retrain_sweeps(plan, ["search_0", "random_3"])
    assert judged.overrides[len(plan.train_overrides):] == (
        "seed=0", f"init_from='{tmp_path / 'retrain_relu'}/${{aso_se.stem:${{genotype}}}}_seed0'", "epochs=5",
        "threshold_init=lsq", "optim.optimizer.lr=0.03", "optim.scheduler.warmup_epochs=0")
    # a recipe without a warm-up (experiment=smoke's scheduler) gets no warm-up override; no --warm-start: no stage
    smoke = bench.make_plan(bench.parse_args(["--out", str(tmp_path), "--smoke", "--warm-start", "1"]))
    assert smoke.warm_start == ("epochs=1", "threshold_init=lsq", "optim.optimizer.lr=0.02")
    assert bench.relu_sweeps(bench.make_plan(bench.parse_args(["--out", str(tmp_path)])), ["search_0"]) == []


def test_warm_start_must_be_a_positive_number_of_epochs(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", str(tmp_path), "--warm-start", "0"])
    assert "--warm-start must be at least 1 epoch" in capsys.readouterr().err


def test_the_warm_started_smoke_benchmark_starts_every_cell_from_its_relu_run(tmp_path):
    out = tmp_path / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert bench.main(["--out", str(out), "--smoke", "--searches", "1", "--randoms", "1", "--warm-start", "1",
                           "--train-override", "neuron=st_bif_qann"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["budget"]["warm_start"] == ["epochs=1", "threshold_init=lsq", "optim.optimizer.lr=0.02"]
    for source in ("search_0", "random_0", "DARTS_V2", "POOR_POOL_SKIP"):
        log = (out / "retrain" / f"{source}_seed0" / "train.log").read_text()
        assert f"init_from {out / 'retrain_relu' / f'{source}_seed0'}/checkpoints/last.pt" in log
        assert "threshold_init=lsq" in log
        assert json.loads((out / "retrain_relu" / f"{source}_seed0" / "metrics.json").read_text())["test_acc"] >= 0
