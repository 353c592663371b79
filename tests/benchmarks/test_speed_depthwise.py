"""benchmarks/speed_depthwise.py (speed.py --case depthwise) and the retrain step's depthwise row option, on a CPU."""
import torch

from benchmarks import speed, speed_depthwise, speed_retrain_step


def test_tiny_run_times_both_implementations_per_shape_and_checks_they_agree(capsys):
    rows = speed_depthwise.main(["--tiny"])
    shapes = len(speed_depthwise.TINY_SHAPES)
    assert len(rows) == 4 * shapes + 1
    assert [row.metric.rsplit(": ", 1)[1] for row in rows[:4]] == ["cuDNN", "ours", "ours / cuDNN",
                                                                   "forward alone, ours / cuDNN"]
    assert abs(rows[2].value * rows[0].value / rows[1].value - 1) < 0.01  # the ratio of the rounded times
    differences = [float(row.note.rsplit(" ", 1)[1]) for row in rows[:-1] if "difference" in row.note]
    assert len(differences) == 3 * shapes
    assert max(differences) < 5e-3  # fp16 outputs and gradients of the two agree
    assert "ours / cuDNN" in capsys.readouterr().out


def test_least_bytes_count_the_forward_and_backward_tensors_once():
    x = torch.empty(2, 3, 8, 8, dtype=torch.float16)
    y = torch.empty(2, 3, 4, 4, dtype=torch.float16)
    weight = torch.empty(3, 1, 3, 3, dtype=torch.float16)
    xb, yb, wb = 2 * 3 * 64 * 2, 2 * 3 * 16 * 2, 27 * 2
    assert speed_depthwise.least_bytes(x, y, weight) == (xb + wb + yb) + (yb + xb + wb + xb + wb)


def test_the_retrain_step_takes_a_depthwise_backend_per_row(capsys):
    rows = speed_retrain_step.main(["--tiny", "--rows", "2:fp32:cl:torch,2:fp32:cl:torch:triton"])
    metrics = [row.metric for row in rows if row.metric.endswith(": step")]
    assert len(metrics) == 2 and "depthwise" not in metrics[0] and "depthwise triton" in metrics[1]
    table = capsys.readouterr().out
    assert "| 2 | fp32 | cl | torch | triton |" in table
    losses = [float(line.rsplit("|", 2)[1]) for line in table.splitlines() if line.startswith("| 2 | fp32 | cl")]
    assert abs(losses[0] - losses[1]) < 1e-4  # the same network and batch: the same loss either way


def test_the_case_is_one_of_the_suites():
    assert speed.DEFAULT_ROWS["depthwise"] == "speed.csv"
