"""benchmarks/metrics_from_log.py: a lost metrics.json rebuilt from the run's train.log equals what train.py wrote,
to the log's rounding."""
from __future__ import annotations

import json

import pytest

from benchmarks import metrics_from_log
from tests.aso_se.run.helpers import SMOKE, run_in_process


@pytest.fixture(scope="module")
def finished_qann_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("qann")
    code = run_in_process("train", *SMOKE, "genotype=PC_DARTS", "epochs=2", "neuron=st_bif_qann",
                          "hydra.run.dir=run", cwd=cwd)
    assert code == 0
    return cwd / "run"


def test_the_rebuilt_metrics_equal_the_written_ones_to_the_logs_rounding(finished_qann_run, tmp_path, capsys):
    run = tmp_path / "run"
    written = json.loads((finished_qann_run / "metrics.json").read_text())
    (run / ".hydra").mkdir(parents=True)
    for name in ("train.log", ".hydra/config.yaml"):
        (run / name).write_text((finished_qann_run / name).read_text())
    assert metrics_from_log.main([str(run)]) == 0
    rebuilt = json.loads((run / "metrics.json").read_text())
    assert rebuilt["params_m"] == written["params_m"] and rebuilt["genotype"] == written["genotype"]
    assert rebuilt["epochs"] == written["epochs"] == len(rebuilt["history"]) == 2
    for key in ("test_acc", "test_loss", "best_test_acc", "snn_test_acc"):  # the log's 4 significant digits
        assert rebuilt[key] == pytest.approx(written[key], rel=5e-4, abs=1e-4), key
    for old, new in zip(written["history"], rebuilt["history"]):
        assert new["epoch"] == old["epoch"] and new["train_loss"] == pytest.approx(old["train_loss"], rel=1e-3)
    assert rebuilt["snn_timesteps"] == written["snn_timesteps"] and rebuilt["snn_silent"] == written["snn_silent"]
    assert rebuilt["world_size"] == 1 and rebuilt["device"] == written["device"] and rebuilt["cpu_time_s"] is None
    assert rebuilt["pending"] == ["energy", "firing_rates"] and rebuilt["recovered_from"] == "train.log"
    assert "test_acc" in capsys.readouterr().out

    assert metrics_from_log.main([str(run)]) == 2  # never over a metrics.json
    assert "exists" in capsys.readouterr().err and json.loads((run / "metrics.json").read_text()) == rebuilt


def test_a_log_without_its_last_epoch_is_refused(finished_qann_run, tmp_path, capsys):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text((finished_qann_run / ".hydra" / "config.yaml").read_text())
    lines = (finished_qann_run / "train.log").read_text().splitlines()
    last_epoch = max(i for i, line in enumerate(lines) if "retrain epoch 2/2" in line)
    (run / "train.log").write_text("\n".join(lines[:last_epoch]) + "\n")
    assert metrics_from_log.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 of 2 epochs" in err and "resume=" in err
    assert not (run / "metrics.json").exists()


def test_a_pending_snn_is_filled_in_from_the_log(finished_qann_run, tmp_path, capsys):
    run = tmp_path / "run"
    written = json.loads((finished_qann_run / "metrics.json").read_text())
    trained = {key: value for key, value in written.items() if not key.startswith("snn_")}
    run.mkdir()
    (run / "train.log").write_text((finished_qann_run / "train.log").read_text())
    (run / "metrics.json").write_text(json.dumps({**trained, "pending": ["snn", "energy"]}))
    assert metrics_from_log.main([str(run)]) == 0
    filled = json.loads((run / "metrics.json").read_text())
    assert filled["snn_test_acc"] == pytest.approx(written["snn_test_acc"], abs=1e-4)
    assert filled["snn_timesteps"] == written["snn_timesteps"] and filled["snn_silent"] == written["snn_silent"]
    assert filled["pending"] == ["energy"] and filled["snn_recovered_from"] == "train.log"
    assert filled["history"] == written["history"] and "pending energy" in capsys.readouterr().out

    without_snn = "".join(line for line in (finished_qann_run / "train.log").read_text().splitlines(keepends=True)
                          if "SNN:" not in line)
    (run / "train.log").write_text(without_snn)
    (run / "metrics.json").write_text(json.dumps({**trained, "pending": ["snn", "energy"]}))
    assert metrics_from_log.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no SNN line" in err and "resume=" in err
    assert json.loads((run / "metrics.json").read_text())["pending"] == ["snn", "energy"]
