"""benchmarks/common.py: what the benchmarks share (statistics, override quoting, reading runs back).

The runner and the override checks run end to end in each benchmark's own tests."""
from __future__ import annotations

import pytest

from benchmarks import common as bench
from search_space.errors import UserInputError


def test_mean_std_is_the_sample_std():
    assert bench.mean_std([0.5, 0.7, 0.9]) == (pytest.approx(0.7), pytest.approx(0.2))
    assert bench.mean_std([0.25]) == (0.25, None)
    with pytest.raises(ValueError):
        bench.mean_std([])


def test_user_input_errors_are_one_line():
    with pytest.raises(UserInputError, match="single quote"):
        bench.quoted("/tmp/it's")


def test_same_config_ignores_only_the_keys_it_is_told_to(tmp_path):
    def result(name: str, seed: int, epochs: int) -> bench.JobResult:
        run_dir = tmp_path / name
        (run_dir / ".hydra").mkdir(parents=True)
        (run_dir / ".hydra" / "config.yaml").write_text(f"seed: {seed}\nepochs: {epochs}\ndata: {{name: mnist5k}}\n")
        job = bench.Job(name=name, arm="a", script="train.py", overrides=(), run_dir=run_dir, log=run_dir / "log",
                        seed=seed, source=name)
        return bench.JobResult(job, returncode=0, wall_s=1.0, cpu_s=1.0)

    same = [result("a", 0, 5), result("b", 1, 5)]
    assert bench.same_config(same, ignore=("seed",)) == {"epochs": 5, "data": {"name": "mnist5k"}}
    with pytest.raises(bench.BenchmarkError, match="runs a and b ran with different configs"):
        bench.same_config(same, ignore=())
    with pytest.raises(bench.BenchmarkError, match=r"runs a and c .*c/\.hydra/config\.yaml"):
        bench.same_config([*same, result("c", 2, 6)], ignore=("seed",))
