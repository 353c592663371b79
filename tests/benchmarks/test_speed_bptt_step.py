"""The BPTT speed case (benchmarks/speed_bptt_step.py) on a CPU: its smoke run times the QANN step, the SNN's BPTT
step and both peers in one process, the ratios divide the right rows, and bad input is one line."""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

import pytest
from spikingjelly.activation_based import neuron as sj_neuron
from torch.nn.utils import parametrize
from triton import knobs as triton_knobs

from aso_se.run.stop_signals import os_handler
from benchmarks import speed, speed_bptt_step
from benchmarks.speed_bptt_step import Row, StepTime
from kernels.sparse_conv import SparseConv2d
from kernels.st_bif import STBIFNeuron
from search_space.neurons import SpikingNeuron
from search_space.trainable_snn import trainable_snn


def test_the_smoke_run_times_qann_bptt_and_peers_side_by_side(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(speed, "RESULTS", tmp_path)
    assert speed.main(["--case", "bptt_step", "--tiny"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| DARTS_V2")]
    assert [line.split(" | ")[:4] for line in table] == [
        ["| DARTS_V2_SPIKE_NATIVE", "QANN step", "", "4"],
        ["| DARTS_V2_SPIKE_NATIVE", "binary SNN BPTT", "2", "4"],
        ["| DARTS_V2_SPIKE_NATIVE", "BPTT, spikingjelly 2.0 IFNode (torch-reference)", "2", "4"],
        ["| DARTS_V2_SPIKE_NATIVE", "binary SNN BPTT, ST-BIF torch reference", "2", "4"],
        ["| DARTS_V2_SPIKE_NATIVE", "binary SNN BPTT, norm scales as passes of their own", "2", "4"],
        ["| DARTS_V2", "QANN step", "", "4"],
        ["| DARTS_V2", "binary SNN BPTT", "2", "4"]]
    assert "(QANN step) |" in table[1] and "(ours) |" in table[2] and "(ours) |" in table[4]
    rows = [line for line in out.splitlines() if line.startswith("bptt_step | ")]
    assert "bptt_step | DARTS_V2 3×4, binary SNN BPTT, T = 2, batch 4, fp32, eager: step / QANN step | " in "\n".join(
        rows)
    assert not list(tmp_path.iterdir())  # a smoke run writes no rows


def test_the_peers_keep_the_network_and_swap_only_its_neurons():
    args = argparse.Namespace(level=4, channels=4, layers=3, depthwise_backend="torch")
    qann = speed_bptt_step.qann_network("DARTS_V2", args)
    peer, name = speed_bptt_step.peer_snn("spikingjelly", qann, 2, speed_bptt_step.torch.device("cpu"))
    reference, _ = speed_bptt_step.peer_snn("reference", qann, 2, speed_bptt_step.torch.device("cpu"))
    neurons = [m.neuron for m in peer.modules() if isinstance(m, SpikingNeuron)]
    assert neurons and all(isinstance(n, sj_neuron.IFNode) and n.step_mode == "m" for n in neurons)
    assert all(m.stateful for m in peer.modules() if isinstance(m, SpikingNeuron))
    ours = [m.neuron for m in reference.modules() if isinstance(m, SpikingNeuron)]
    assert len(ours) == len(neurons) and all(isinstance(n, STBIFNeuron) and n.backend == "torch" for n in ours)
    assert name == "BPTT, spikingjelly 2.0 IFNode (torch-reference)"
    separate, _ = speed_bptt_step.peer_snn("separate_scales", qann, 2, speed_bptt_step.torch.device("cpu"))
    assert not any(parametrize.is_parametrized(m) for m in separate.modules())
    assert any(parametrize.is_parametrized(m) for m in reference.modules())  # ours: scales folded into convs


def test_rows_divide_the_step_by_its_baseline_at_the_same_batch():
    qann = Row("G", "QANN step", 0, 64, "graph", StepTime(0.02, 0.019, 0.001, 10.0))
    bptt = speed_bptt_step.compared(Row("G", "binary SNN BPTT", 8, 64, "graph", StepTime(0.05, 0.049, 0.001, 30.0)),
                                    qann, "QANN step")
    assert bptt.ratio == pytest.approx(2.5) and bptt.images_per_second() == pytest.approx(1280)
    out_of_memory = speed_bptt_step.compared(Row("G", "binary SNN BPTT", 8, 64, "graph", None), qann, "QANN step")
    assert out_of_memory.ratio is None
    args = argparse.Namespace(layers=20, channels=36, precision="fp16", level=4, depthwise_backend="torch")
    found = {m.metric: m for m in speed_bptt_step.measurements([qann, bptt, out_of_memory], args)}
    key = "G 20×36, binary SNN BPTT, T = 8, batch 64, fp16, CUDA graph"
    assert found[f"{key}: step / QANN step"].value == 2.5 and found[f"{key}: throughput"].value == 1280
    assert found[f"{key}: step, CUDA events"].value == 49.0 and found[f"{key}: peak memory"].unit == "GiB"
    assert found["G 20×36, QANN step, batch 64, fp16, CUDA graph: step, host wall clock"].value == 20.0
    args.depthwise_backend = "triton"  # our depthwise kernels: named in every row
    assert all(", fp16, depthwise triton, CUDA graph" in m.metric for m in speed_bptt_step.measurements([qann], args))


def test_the_depthwise_backend_reaches_the_fine_tuned_snns_convs():
    args = argparse.Namespace(level=4, channels=4, layers=3, depthwise_backend="triton")
    snn = trainable_snn(speed_bptt_step.qann_network("DARTS_V2_SPIKE_NATIVE", args), 2)
    backends = {m.depthwise_backend for m in snn.modules() if isinstance(m, SparseConv2d) and m.groups > 1}
    assert backends == {"triton"}


def test_bad_input_is_one_line(capsys):
    assert speed.main(["--case", "bptt_step", "--rows-out", ""]) == 2  # no GPU here and no --tiny
    assert capsys.readouterr().err.strip() == ("speed.py --case bptt_step: bptt_step times a GPU's steps: run it "
                                               "with CUDA, or pass --tiny (a CPU smoke run)")
    with pytest.raises(SystemExit):
        speed.main(["--case", "bptt_step", "--timesteps", "4,0"])
    assert "'4,0' is not a comma-separated list of positive integers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        speed.main(["--case", "bptt_step", "--peers", "snntorch"])
    assert "'snntorch' is not one of spikingjelly, reference, separate_scales" in capsys.readouterr().err


def test_a_stopped_case_keeps_and_writes_the_rows_it_timed(tmp_path, monkeypatch, capsys):
    """A stop (SIGTERM, which speed.py makes a KeyboardInterrupt) in the second genotype: the first one's rows stay."""
    timed = speed_bptt_step.genotype_rows

    def stop_at_the_second(genotype, args, device, peers, rows):
        if genotype == "DARTS_V2":
            raise KeyboardInterrupt
        timed(genotype, args, device, peers, rows)

    monkeypatch.setattr(speed_bptt_step, "genotype_rows", stop_at_the_second)
    out_file = tmp_path / "speed.csv"
    assert speed.main(["--case", "bptt_step", "--tiny", "--rows-out", str(out_file)]) == 0
    captured = capsys.readouterr()
    assert "stopped after 5 rows: keeping them" in captured.err  # the QANN step, ours and the three peers
    written = out_file.read_text()
    assert "DARTS_V2_SPIKE_NATIVE 3×4, binary SNN BPTT, T = 2" in written and "DARTS_V2 3×4" not in written


def test_sigterm_stops_a_case_like_ctrl_c():
    before = signal.getsignal(signal.SIGTERM)
    try:
        speed.stop_on_sigterm()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in this (main) thread before the next line
            assert False, "SIGTERM did not interrupt"
    finally:
        triton_knobs.runtime.kernel_load_end_hook.remove(speed.put_back_sigterm)
        signal.signal(signal.SIGTERM, before)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the OS handler through glibc")
def test_sigterm_still_stops_a_case_after_triton_replaced_its_handler():
    """LLVM's sigaction() on Triton's first compile is invisible to Python: the kernel-load hook puts ours back."""
    before = signal.getsignal(signal.SIGTERM)
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    try:
        speed.stop_on_sigterm()
        libc.signal(signal.SIGTERM, ctypes.c_void_p(0))  # SIG_DFL behind Python's back, as LLVM's handler kills
        assert os_handler(signal.SIGTERM) == 0
        triton_knobs.runtime.kernel_load_end_hook(None, None, "kernel", None, "hash")
        assert os_handler(signal.SIGTERM) != 0, "a SIGTERM now would kill the test run"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            assert False, "SIGTERM did not interrupt"
    finally:
        triton_knobs.runtime.kernel_load_end_hook.remove(speed.put_back_sigterm)
        signal.signal(signal.SIGTERM, before)


def test_the_profile_splits_both_steps_by_kernel_class_at_the_same_image_steps(monkeypatch):
    monkeypatch.setattr(speed_bptt_step, "genotype_rows", lambda *args: None)  # only the profile
    rows = speed_bptt_step.main(["--tiny", "--genotypes", "DARTS_V2", "--profile"])
    metrics = [row.metric for row in rows]
    assert "DARTS_V2 3×4, QANN step, batch 8, fp32, eager: conv: time per step" in metrics  # T = 2 × batch 4
    assert "DARTS_V2 3×4, binary SNN BPTT, T = 2, batch 4, fp32, eager: conv: time per step" in metrics
    profiled = [row for row in rows if row.case == "bptt_step"]
    assert all(row.value > 0 and row.unit == "ms" for row in profiled)
    # each step's roofline: its least bytes per class (no batch norm in the SNN: folded) against those times
    floors = {row.metric: row.value for row in rows if row.case == "roofline" and row.metric.endswith("least bytes")}
    qann = "DARTS_V2 3×4, QANN step, batch 8, fp32, eager"
    bptt = "DARTS_V2 3×4, binary SNN BPTT, T = 2, batch 4, fp32, eager"
    assert floors[f"{qann}: batch norm: least bytes"] > 0 and f"{bptt}: batch norm: least bytes" not in floors
    step = "step, kernel time of an eager step: least bytes"
    neurons = floors[f"{bptt}: quantizer / neuron: least bytes"]
    assert floors[f"{bptt}: {step}"] > neurons > 0 < floors[f"{qann}: {step}"]
