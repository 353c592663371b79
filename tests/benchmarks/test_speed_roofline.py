"""The retrain step's roofline (benchmarks/speed_roofline.py): the byte model against counts made by hand, the
recorder on real layers and a DARTS network, the profiler's kernel classes, the table's arithmetic and the case's
CPU smoke run."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks import speed, speed_retrain_step, speed_roofline
from benchmarks.speed_roofline import LayerCall, call_bytes, minimum_bytes, optimizer_bytes, record_step
from search_space.errors import UserInputError
from search_space.network import build_network
from search_space.neurons import NeuronFactory, QuantizedActivation


def test_one_conv_batch_norm_and_quantizer_move_the_bytes_counted_by_hand():
    """fp32 everywhere: the image [2, 3, 5, 5] is 600 bytes, each activation [2, 4, 5, 5] 800 bytes, the conv's
    3×3 weights 432, the norm's scale and shift 32, the quantizer's θ 4."""
    torch.manual_seed(0)
    network = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4),
                            QuantizedActivation(backend="torch"))
    image = torch.randn(2, 3, 5, 5)
    calls = record_step(network, lambda: network(image).sum().backward())
    assert calls == [LayerCall("conv", 600, 800, 432, input_needs_grad=False),
                     LayerCall("batch norm", 800, 800, 32), LayerCall("quantizer", 800, 800, 4)]
    # conv: reads image, weights, writes output; backward reads the output's gradient, image and weights, writes the
    # weights' gradient (the image needs none)
    assert call_bytes(calls[0]) == (600 + 432 + 800, 800 + 600 + 432 + 432)
    # batch norm and quantizer: the same, and the input's gradient written
    assert call_bytes(calls[1]) == (800 + 32 + 800, 800 + 800 + 32 + 800 + 32)
    assert call_bytes(calls[2]) == (800 + 4 + 800, 800 + 800 + 4 + 800 + 4)
    # clipping reads the gradients; SGD with momentum reads weight, gradient, momentum and writes weight, momentum
    optimizer = optimizer_bytes(432 + 32 + 4, momentum=True, clipped=True)
    assert optimizer == 6 * 468 and optimizer_bytes(468, momentum=False, clipped=False) == 3 * 468
    assert minimum_bytes(calls, optimizer) == {"conv": 4096, "batch norm": 4096, "quantizer / neuron": 4012,
                                               "optimizer": 2808}


class _Fork(nn.Module):
    """A tensor read by two convs: its gradient is the sum of theirs."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.left, self.right = (nn.Conv2d(2, 2, 1, bias=False) for _ in range(3))
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = self.first(x)
        return self.pool(self.left(shared) + self.right(shared))


def test_a_tensor_read_twice_adds_its_gradients_and_pools_keep_what_their_backward_reads():
    network = _Fork()
    x = torch.randn(1, 2, 4, 4, requires_grad=True)
    calls = record_step(network, lambda: network(x).sum().backward())
    assert [c.kind for c in calls] == ["conv", "conv", "conv", "max pool", "gradient sum"]
    assert calls[-1].input_bytes == 2 * 16 * 4  # one extra gradient of the shared [1, 2, 4, 4] tensor
    assert call_bytes(calls[-1]) == (0, 128)
    pool = calls[3]
    assert (pool.input_bytes, pool.output_bytes, pool.output_elements) == (128, 32, 8)
    assert call_bytes(pool) == (128 + 32 + 8, 32 + 8 + 128)  # its argmax: a byte per output
    assert call_bytes(LayerCall("average pool", 128, 32)) == (160, 160)
    with pytest.raises(ValueError, match="no byte rule"):
        call_bytes(LayerCall("dropout"))


@pytest.mark.parametrize("drop_prob", [0.0, 0.1])
def test_every_cell_node_sums_two_edges_and_writes_gradients_only_for_dropped_ones(drop_prob):
    torch.manual_seed(0)
    network = build_network("DARTS_V2", neuron=NeuronFactory("st_bif_qann", timesteps=1), channels=4, layers=3,
                            num_classes=10, auxiliary=True).train()
    network.drop_path_prob = drop_prob
    images, labels = torch.randn(2, 3, 32, 32), torch.tensor([1, 2])

    def step():
        logits, aux = network(images)
        (nn.functional.cross_entropy(logits, labels) + nn.functional.cross_entropy(aux, labels)).backward()

    calls = record_step(network, step)
    sums = [call for call in calls if call.kind == "node sum"]
    assert len(sums) == sum(len(cell._ops) // 2 for cell in network.cells)
    dropped = [sum(not isinstance(op, nn.Identity) for op in cell._ops[2 * node:2 * node + 2])
               for cell in network.cells for node in range(len(cell._ops) // 2)]
    assert [call.scaled_terms for call in sums] == [count if drop_prob else 0 for count in dropped]
    assert all(call.input_bytes == 2 * call.output_bytes for call in sums)
    assert any(call.kind == "gradient sum" for call in calls)  # e.g. a cell's output, read by the next two cells
    classes = minimum_bytes(calls)
    assert set(classes) == {"conv", "batch norm", "quantizer / neuron", "pool", "elementwise"}


@pytest.mark.parametrize("name,label", [
    ("void cudnn::batchnorm_bwtr_nhwc_semiPersist<__half, float, __half, 512, 16, 3, 4, 1, 0, tr", "batch norm"),
    ("void at::native::batch_norm_backward_reduce_kernel<c10::BFloat16, float, float, int>(torch", "batch norm"),
    ("_drop_path_sum_fwd_kernel", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::Half>, ", "elementwise"),
    ("_quantize_bwd_kernel", "quantizer / neuron"),
    ("wgrad2d_c1_k1_nhwc", "conv"),
    ("sm90_xmma_depthwise_convolution_dgrad_tiling_f16f16_f32f32_f32_nhwckrsc_nhwc_tilesize1x8x8", "conv"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_f16_64x256_32x4_tn_align2>(cutlas", "conv"),
    ("_pool_bwd_kernel", "pool"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_alignedK_contig<at::native::(a", "copy / layout"),
    ("void at::native::multi_tensor_apply_kernel<FusedSgdMathFunctor<c10::Half>>", "optimizer"),
])
def test_kernels_of_an_h100_profile_fall_in_the_byte_models_classes(name, label):
    assert speed_retrain_step.kernel_class(name) == label
    assert set(speed_roofline.KIND_CLASSES.values()) | {"optimizer"} <= set(speed_retrain_step.CLASS_NAMES)


def test_the_hbm_bandwidth_follows_the_gpus_name_or_the_override():
    assert speed_roofline.hbm_gbps("NVIDIA H100 80GB HBM3") == 3350
    assert speed_roofline.hbm_gbps("NVIDIA H200") == 4800
    assert speed_roofline.hbm_gbps("NVIDIA H100 PCIe") == 2000
    assert speed_roofline.hbm_gbps("NVIDIA A100-SXM4-80GB", 2039) == 2039
    with pytest.raises(UserInputError, match="--hbm-gbps"):
        speed_roofline.hbm_gbps("NVIDIA A100-SXM4-80GB")
    with pytest.raises(UserInputError, match="--hbm-gbps 0"):
        speed_roofline.hbm_gbps("NVIDIA H200", 0)


def test_the_table_reads_the_least_bytes_at_the_measured_time_against_hbm(capsys):
    lines = speed_roofline.roofline_lines({"conv": 3_350_000_000, "batch norm": 0}, {"conv": 0.002, "other": 0.001},
                                          {"conv": 7, "other": 1}, ["conv", "batch norm", "other"],
                                          {"step, CUDA graph replay (wall)": 0.004})
    assert [line.name for line in lines] == ["conv", "other", "step, CUDA graph replay (wall)"]
    conv, other, step = lines
    assert conv.floor_seconds(3350) == pytest.approx(0.001)
    assert conv.achieved_gbps() == pytest.approx(1675) and conv.share_of_hbm(3350) == pytest.approx(50)
    assert other.achieved_gbps() == 0 and step.share_of_hbm(3350) == pytest.approx(25)
    speed_roofline.print_roofline(lines, 3350, "title")
    assert "| conv | 3.350 | 1.00 | 2.00 | 1,675 | 50.0 | 1.00 | 7 |" in capsys.readouterr().out
    rows = {m.metric: m for m in speed_roofline.measurements(lines, 3350, "net", "note")}
    assert (rows["net: conv: share of HBM bandwidth"].value, rows["net: conv: least bytes"].unit) == (50.0, "GB")
    assert rows["net: other: time"].value == 1.0 and "net: other: achieved bandwidth" not in rows
    assert {m.case for m in rows.values()} == {"roofline"}


def test_the_case_runs_on_a_cpu_and_writes_no_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(speed, "RESULTS", tmp_path)
    assert speed.main(["--case", "roofline", "--tiny"]) == 0
    out = capsys.readouterr().out
    assert "Roofline of one training step (DARTS_V2 3×4 st_bif_qann, batch 4, fp32, cl); HBM 100 GB/s" in out
    assert "| step, kernel time of an eager step |" in out and "roofline | DARTS_V2 3×4" in out
    assert not list(tmp_path.iterdir())
    assert speed.main(["--case", "roofline", "--tiny", "--hbm-gbps", "-1", "--rows-out", ""]) == 2
    assert capsys.readouterr().err.strip() == ("speed.py --case roofline: --hbm-gbps -1.0: pass the GPU's HBM "
                                               "bandwidth in GB/s, e.g. 3350")


def test_the_dense_row_sums_into_the_concatenation_and_hands_dense_gradients():
    import argparse
    args = argparse.Namespace(genotype="DARTS_V2", neuron="st_bif_qann", channels=4, layers=3, conv_backend="torch",
                              graph=False)
    flags = {}
    for mode in ("auto", "dense", "cat", "torch"):
        trainer = speed_retrain_step.make_trainer(args, (2, "fp32", "cl", mode, "torch"), torch.device("cpu"))
        cell = trainer.network.cells[0]
        flags[mode] = (cell.drop_path_backend, cell.sums_into_concat, cell.dense_concat_grads)
    assert flags == {"auto": ("auto", True, False), "dense": ("auto", True, True), "cat": ("auto", False, False),
                     "torch": ("torch", True, False)}
