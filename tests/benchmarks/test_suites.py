"""The suites' command lines: a case's measurements become result rows with where and how they were measured, and
the accuracy suite turns each case's summary into one row per retrained cell."""
from __future__ import annotations

import json

from benchmarks import accuracy, speed, tools
from benchmarks.rows import COLUMNS, Measurement, read_rows


def test_a_speed_case_appends_its_measurements_with_the_command(tmp_path, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(speed, "run_case", lambda case, argv: seen.append((case, argv)) or
                        [Measurement(case, "step", 12.5, "ms", "tiny")])
    rows_out = tmp_path / "speed.csv"
    assert speed.main(["--case", "retrain_step", "--rows", "4:fp32:cl", "--rows-out", str(rows_out)]) == 0
    assert seen == [("retrain_step", ["--rows", "4:fp32:cl"])]  # the case's own --rows passes through
    [row] = read_rows(rows_out)
    assert set(row) == set(COLUMNS) and row["gpu"] == "cpu" and row["torch"] and row["commit"]
    assert (row["case"], row["metric"], row["value"], row["unit"], row["note"]) == ("retrain_step", "step", "12.5",
                                                                                     "ms", "tiny")
    assert "1 rows appended" in capsys.readouterr().out
    assert speed.main(["--case", "retrain_step", "--rows-out", ""]) == 0 and len(read_rows(rows_out)) == 1


def test_the_scaling_cases_read_each_epochs_images_per_second(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({"history": [{"images_per_second": r} for r in (9, 20, 22)]}))
    assert speed.epoch_rates(tmp_path, "train.py") == [20, 22]  # the first epoch compiles and captures
    (tmp_path / "search.log").write_text("cycle 0 warmup (epoch 1) | images_per_second 5\n"
                                         "cycle 0 search (epoch 2) | loss 1 images_per_second 100.0\n"
                                         "cycle 0 search (epoch 3) | loss 1 images_per_second 3.5e+03\n")
    assert speed.epoch_rates(tmp_path, "search.py") == [3500.0]


def test_search_vs_random_rows_name_the_protocol_and_the_cell():
    run = {"test_acc": 0.9298, "energy_per_image_uj": 45071.6}
    summary = {"searched": [{**run, "run_dir": "/o/retrain/search_0_seed0"}],
               "random": [{**run, "run_dir": "/o/retrain/random_1_seed0", "energy_per_image_uj": None}],
               "reference": [{**run, "run_dir": "/o/retrain/DARTS_V2_seed0"}], "poor": []}
    rows = accuracy.search_vs_random_rows(summary, "full")
    assert [(m.case, m.metric, m.value, m.unit, m.note) for m in rows] == [
        ("full/searched", "test accuracy", 92.98, "%", "search_0_seed0"),
        ("full/searched", "SNN energy per image", 45072, "µJ", "search_0_seed0"),
        ("full/random", "test accuracy", 92.98, "%", "random_1_seed0"),
        ("full/DARTS_V2", "test accuracy", 92.98, "%", "DARTS_V2_seed0"),
        ("full/DARTS_V2", "SNN energy per image", 45072, "µJ", "DARTS_V2_seed0")]
    assert accuracy.default_label("search_vs_random", ["--budget", "full"]) == "full"
    # beyond the retrains: the searches' spread and the ranking against the full budget, where defined
    summary["search_spread"] = {"cells": 3, "pairs": 3, "normal": {"edges": 8, "mean": 5.0, "max": 6},
                                "reduce": {"edges": 8, "mean": 4.333, "max": 5}}
    summary["rank_agreement"] = {"tau": 0.14286, "p": 0.7726, "cells": [{"cell": name} for name in ("a", "b", "c")]}
    extra = [(m.case, m.metric, m.value, m.unit) for m in accuracy.search_vs_random_rows(summary, "proxy")[5:]]
    assert extra == [("proxy/searches", accuracy.DISTANCE_METRIC, 9.33, "edges"),
                     ("proxy/ranking", accuracy.TAU_METRIC, 0.143, "")]
    assert accuracy.search_vs_random_rows(summary, "proxy")[-1].note == "3 cells in common: a, b, c; p = 0.77"
    summary["rank_agreement"]["tau"] = None  # fewer than three cells in common: no τ row
    summary["search_spread"]["pairs"] = 0
    assert len(accuracy.search_vs_random_rows(summary, "proxy")) == 5
    assert accuracy.default_label("energy_sweep", ["--search-override", "search_space=spike_native"]) == \
        "spike-native space"


def test_retrain_arm_and_energy_sweep_rows():
    runs = [{"arm": "st_bif_qann", "seed": 1, "test_acc": 0.7685, "snn_test_acc": 0.7667, "snn_timesteps": 24}]
    assert [(m.case, m.metric, m.value) for m in accuracy.retrain_arms_rows({"runs": runs}, "small")] == [
        ("small/st_bif_qann", "test accuracy", 76.85), ("small/st_bif_qann", "its SNN: test accuracy", 76.67)]
    sweep = [{"energy_weight": 0.03, "search_seed": 0, "test_acc": 0.6303, "energy_per_image_uj": 124.44}]
    assert [(m.case, m.value, m.unit) for m in accuracy.energy_sweep_rows({"runs": sweep}, "DARTS space")] == [
        ("DARTS space, λ = 0.03", 63.03, "%"), ("DARTS space, λ = 0.03", 124.4, "µJ")]


def test_a_smoke_run_writes_no_rows_and_tools_name_their_tools(tmp_path, monkeypatch, capsys):
    from benchmarks import energy_pareto

    out = tmp_path / "out"

    def fake_main(argv):
        out.mkdir()
        (out / "summary.json").write_text(json.dumps({"runs": []}))
        return 0

    monkeypatch.setattr(energy_pareto, "main", fake_main)
    monkeypatch.setattr(accuracy, "RESULTS", tmp_path / "results")
    assert accuracy.main(["energy_sweep", "--out", str(out), "--smoke"]) == 0
    assert not (tmp_path / "results").exists()
    assert tools.main(["nothing"]) == 2 and "derive_cell,op_strength,snn_latency" in capsys.readouterr().err


def test_the_deployed_binary_snn_gets_rows_at_t4_and_t8_in_both_protocols():
    fine_tuned = {"test_acc": 0.7675, "energy_per_image_uj": 827.0, "snn_energy_uj": 344.5,
                  "snn_acc_at_t": {"1": 0.10, "4": 0.7709, "8": 0.7387, "16": 0.7387}}
    summary = {"searched": [{**fine_tuned, "run_dir": "/o/retrain/search_0_seed0"}], "random": [], "reference": [],
               "poor": []}
    rows = [(m.case, m.metric, m.value, m.unit) for m in accuracy.search_vs_random_rows(summary, "8x16")]
    assert rows[2:] == [("8x16/searched", "binary SNN, T = 4: test accuracy", 77.09, "%"),
                        ("8x16/searched", "binary SNN, T = 8: test accuracy", 73.87, "%"),
                        ("8x16/searched", "binary SNN: energy per image", 344.5, "µJ")]
    runs = [{"arm": "relu", "seed": 0, "test_acc": 0.814, "snn_test_acc": None, "snn_acc_t4": None,
             "snn_acc_t8": None, "energy_per_image_uj": 199.8},
            {"arm": "st_bif_qann:level=4", "seed": 0, "test_acc": 0.7675, "snn_test_acc": 0.7681, "snn_timesteps": 10,
             "snn_acc_t4": 0.7709, "snn_acc_t8": 0.7387, "energy_per_image_uj": 344.5}]
    rows = [(m.case, m.metric, m.value) for m in accuracy.retrain_arms_rows({"runs": runs}, "small")]
    assert rows == [("small/relu", "test accuracy", 81.4),
                    ("small/st_bif_qann:level=4", "test accuracy", 76.75),
                    ("small/st_bif_qann:level=4", "its SNN: test accuracy", 76.81),
                    ("small/st_bif_qann:level=4", "binary SNN, T = 4: test accuracy", 77.09),
                    ("small/st_bif_qann:level=4", "binary SNN, T = 8: test accuracy", 73.87),
                    ("small/st_bif_qann:level=4", "binary SNN: energy per image", 344.5)]
