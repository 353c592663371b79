"""benchmarks/sampling_balance.py: each op's chance to be computed in a step, from a search's α at a cycle's end."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from aso_se.search.arch_params import BatchedArchitectureUpdate, SamplingConfig, draw_samples
from benchmarks import sampling_balance

PRIMITIVES = ["none", "max_pool_3x3", "skip_connect", "sep_conv_3x3", "dil_conv_5x5"]
# softmax(α) per edge: a decided edge, a flat one, one with a pruned op (0)
NORMAL = [[0.05, 0.05, 0.1, 0.7, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2], [0.1, 0.0, 0.3, 0.2, 0.4]]
REDUCE = [[0.1, 0.5, 0.2, 0.1, 0.1], [0.3, 0.1, 0.1, 0.3, 0.2], [0.2, 0.2, 0.2, 0.2, 0.2]]


def search_run(root: Path, k: object = 2, cycles: int = 1, sampling: str = "") -> Path:
    run = root / "search_0"
    (run / "alphas").mkdir(parents=True)
    for cycle in range(cycles):
        alphas = {"primitives": PRIMITIVES, "steps": 2, "multiplier": 2, "normal": NORMAL, "reduce": REDUCE}
        (run / "alphas" / f"cycle_{cycle}.json").write_text(json.dumps(alphas))
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text(
        f"search:\n  sampling:\n    k: {'null' if k is None else k}\n{sampling}optim:\n  arch:\n    lr: 0.024\n")
    return run


@pytest.mark.parametrize("probs", [[0.05, 0.05, 0.1, 0.7, 0.1], [0.1, 0.0, 0.3, 0.2, 0.4], [0.4, 0.6]])
def test_two_draws_match_plackett_luce_closed_form(probs) -> None:
    # op i is first with p_i, or second after j with p_j * p_i / (1 - p_j)
    expected = [p + sum(q * p / (1 - q) for j, q in enumerate(probs) if j != i) for i, p in enumerate(probs)]
    assert sampling_balance.inclusion(probs, 2) == pytest.approx(expected)
    assert sum(sampling_balance.inclusion(probs, 2)) == pytest.approx(min(2, sum(p > 0 for p in probs)))


def test_one_draw_is_the_probabilities_and_k_past_the_unpruned_ops_computes_them_all() -> None:
    probs = [0.1, 0.0, 0.3, 0.2, 0.4]
    assert sampling_balance.inclusion(probs, 1) == pytest.approx(probs)
    assert sampling_balance.inclusion(probs, 4) == pytest.approx([1.0, 0.0, 1.0, 1.0, 1.0])
    assert sampling_balance.inclusion(probs, 7) == pytest.approx([1.0, 0.0, 1.0, 1.0, 1.0])


def test_the_engines_gumbel_top_k_computes_ops_as_often_as_the_tool_says() -> None:
    arch = BatchedArchitectureUpdate(len(NORMAL), PRIMITIVES)
    with torch.no_grad():
        probs = torch.tensor(NORMAL)
        arch.alpha.copy_(torch.log(probs.clamp_min(1e-30)))
        arch.op_mask.copy_(probs > 0)  # a pruned op is masked, as the engine prunes it
    draws = 20_000
    samples = draw_samples([arch], draws, SamplingConfig(k=2), temperature=1.0,
                           generator=torch.Generator().manual_seed(0))
    counts = torch.zeros(probs.shape)
    for (sample,) in samples:
        for edge, ops in enumerate(sample.active_ops):
            counts[edge, list(ops)] += 1
    for edge, edge_probs in enumerate(NORMAL):
        # binomial std at 20,000 draws is at most 0.0036: 0.015 is over 4 of them
        assert (counts[edge] / draws).tolist() == pytest.approx(sampling_balance.inclusion(edge_probs, 2), abs=0.015)


def test_a_run_reports_each_cycle_and_cell_from_its_own_k(tmp_path: Path, capsys) -> None:
    run = search_run(tmp_path, k=2, cycles=2)
    out = tmp_path / "balance.json"
    assert sampling_balance.main([str(run), "--out", str(out)]) == 0
    result = json.loads(out.read_text())[str(run)]
    assert result["k"] == 2 and result["arch_lr"] == 0.024 and sorted(result["cycles"]) == ["0", "1"]
    normal = result["cycles"]["0"]["normal"]
    chances = [sampling_balance.inclusion(probs, 2) for probs in NORMAL]
    # strongest ops: sep_conv_3x3, none (ties: the earlier op), dil_conv_5x5
    assert normal["strongest"] == pytest.approx((chances[0][3] + chances[1][0] + chances[2][4]) / 3)
    others = chances[0][1:3] + chances[0][4:] + chances[1][1:] + [chances[2][2], chances[2][3]]
    assert normal["others_mean"] == pytest.approx(sum(others) / len(others))
    assert normal["others_min"] == pytest.approx(min(others))
    assert normal["uniform"] == pytest.approx((2 / 5 + 2 / 5 + 2 / 4) / 3)
    assert normal["strongest_probability"] == pytest.approx((0.7 + 0.2 + 0.4) / 3)
    # the non-none ops' leads: 0.7 - 0.1, 0.2 - 0.2 (a tie), 0.4 - 0.3 (a pruned op is 0, not a runner-up here)
    assert normal["op_lead"] == pytest.approx((0.6 + 0.0 + 0.1) / 3)
    assert normal["strongest"] > normal["uniform"] > normal["others_mean"]
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 + 2 * 2 and table[2].startswith(f"| {run} | 0 | normal | 0.43 |")


def test_k_given_on_the_command_line_wins_over_the_config(tmp_path: Path) -> None:
    run = search_run(tmp_path, k=2)
    one = sampling_balance.run_balance(run, k=1)
    assert one["k"] == 1
    assert one["cycles"]["0"]["reduce"]["strongest"] == pytest.approx((0.5 + 0.3 + 0.2) / 3)
    assert not math.isnan(one["cycles"]["0"]["reduce"]["others_min"])


@pytest.mark.parametrize("case, message", [
    ("no alphas", "holds no cycle_<c>.json; pass search run dirs that ended a cycle"),
    ("every op", "computes every op at every step (search.sampling.k: null): nothing to balance"),
    ("no config", "is missing or names no search.sampling.k; pass --k"),
    ("threshold", "samples with a weight threshold or without Gumbel noise, which this does not model"),
    ("no gumbel", "samples with a weight threshold or without Gumbel noise, which this does not model"),
])
def test_bad_runs_exit_2_with_one_line(tmp_path: Path, capsys, case, message) -> None:
    sampling = {"threshold": "    weight_threshold: 0.1\n", "no gumbel": "    gumbel: false\n"}.get(case, "")
    run = search_run(tmp_path, k=None if case == "every op" else 2, sampling=sampling)
    if case == "no alphas":
        for path in (run / "alphas").iterdir():
            path.unlink()
    if case == "no config":
        (run / ".hydra" / "config.yaml").unlink()
    assert sampling_balance.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
